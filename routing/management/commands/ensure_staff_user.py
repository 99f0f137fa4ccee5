"""Create the first staff user when none exists (used by `make run`).

Credentials come from LOOPSWEB_ADMIN_USER / LOOPSWEB_ADMIN_PASSWORD; without a password one is
generated and printed once. When any staff user exists, nothing changes.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a staff superuser when no staff user exists yet."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
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
