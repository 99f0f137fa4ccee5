"""Create the first staff user when none exists (used by `make run`).

Credentials come from LOOPSWEB_ADMIN_USER / LOOPSWEB_ADMIN_PASSWORD; without a password one is
generated and printed once. When any staff user exists, nothing changes, unless
`--reset-password` is given: then that user's password is set again the same way (the user
must exist and be staff; the password is printed once when generated).
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from ledger.management.terminal import OperatorCommand


class Command(OperatorCommand):
    help = "Create a staff superuser when no staff user exists yet."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--reset-password",
            action="store_true",
            help="set a new password for LOOPSWEB_ADMIN_USER (default admin): "
            "LOOPSWEB_ADMIN_PASSWORD, or a generated one printed once",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        if options["reset_password"]:
            self._reset(User)
            return
        if User.objects.filter(is_staff=True).exists():
            self.stdout.write("staff user exists; nothing to do")
            return
        username = os.environ.get("LOOPSWEB_ADMIN_USER", "").strip() or "admin"
        password = os.environ.get("LOOPSWEB_ADMIN_PASSWORD", "")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(15)
        User.objects.create_superuser(username=username, email="", password=password)
        if generated:
            self.stdout.write(
                f"created staff user {username!r} with password {password} (shown once)"
            )
        else:
            self.stdout.write(
                f"created staff user {username!r} (password from LOOPSWEB_ADMIN_PASSWORD)"
            )

    def _reset(self, User: Any) -> None:
        username = os.environ.get("LOOPSWEB_ADMIN_USER", "").strip() or "admin"
        user = User.objects.filter(username=username, is_staff=True).first()
        if user is None:
            raise CommandError(f"no staff user {username!r} (set LOOPSWEB_ADMIN_USER)")
        password = os.environ.get("LOOPSWEB_ADMIN_PASSWORD", "")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(15)
        user.set_password(password)
        user.save(update_fields=["password"])
        if generated:
            self.stdout.write(
                f"new password for staff user {username!r}: {password} (shown once)"
            )
        else:
            self.stdout.write(
                f"password of staff user {username!r} set from LOOPSWEB_ADMIN_PASSWORD"
            )
