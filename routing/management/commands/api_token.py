"""Create, list and revoke API tokens.

`create NAME --scope ingest [--scope read ...] [--expires 90d]` prints the token once, alone on stdout (so
`TOKEN=$(manage.py api_token create ci --scope ingest)` works); only its SHA-256 is stored,
so a lost token is revoked and replaced, never recovered. `revoke` keeps the row for the
audit trail (name, prefix, when it was last used).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from domain.errors import ApplicationError
from ledger.management.terminal import OperatorCommand
from routing.api.serializers import iso
from routing.api.tokens import (
    SCOPES,
    api_token_create,
    api_token_revoke,
    token_lifetime,
    token_state,
)
from routing.models import ApiToken


class Command(OperatorCommand):
    help = "Manage API tokens: create (shown once), list, revoke."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="create a token and print it once")
        create.add_argument("name")
        create.add_argument(
            "--scope",
            action="append",
            default=[],
            choices=SCOPES,
            help="repeat for several: " + ", ".join(SCOPES),
        )
        create.add_argument(
            "--expires",
            help="the token stops working this long from now: 90d, 12h, 30m, 3600s "
            "(at most 3650d; default: never)",
        )
        listing = actions.add_parser("list", help="list tokens (never the secrets)")
        listing.add_argument("--json", action="store_true", help="print JSON")
        revoke = actions.add_parser("revoke", help="revoke a token by name")
        revoke.add_argument("name")
        revoke.add_argument(
            "--dry-run",
            action="store_true",
            help="say what would happen, change nothing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "create":
                self._create(options["name"], options["scope"], options["expires"])
            elif action == "list":
                self._list(as_json=options["json"])
            else:
                self._revoke(options["name"], dry_run=options["dry_run"])
        except ApplicationError as exc:
            raise CommandError(str(exc)) from None

    def _create(self, name: str, scopes: list[str], expires: str | None) -> None:
        lifetime = token_lifetime(expires) if expires is not None else None
        row, token = api_token_create(name=name, scopes=scopes, expires_in=lifetime)
        until = f", expires {iso(row.expires_at)}" if row.expires_at else ""
        self.stderr.write(
            f"api_token: created {row.name} ({row.prefix}…, scopes: {', '.join(row.scopes)}"
            f"{until}); the token is shown once, store it now"
        )
        self.stdout.write(token)

    def _list(self, *, as_json: bool) -> None:
        rows = list(ApiToken.objects.order_by("name"))
        now = timezone.now()
        entries = [
            {
                "name": row.name,
                "prefix": row.prefix,
                "scopes": row.scopes,
                "createdAt": iso(row.created_at),
                "lastUsedAt": iso(row.last_used_at),
                "revokedAt": iso(row.revoked_at),
                "expiresAt": iso(row.expires_at),
                "state": token_state(row, now),
            }
            for row in rows
        ]
        if as_json:
            self.stdout.write(json.dumps(entries))
            return
        if not entries:
            self.stdout.write("api_token: no tokens")
            return
        for e in entries:
            state = {
                "revoked": f"revoked {e['revokedAt']}",
                "expired": f"expired {e['expiresAt']}",
            }.get(e["state"], "active")
            self.stdout.write(
                f"{e['name']}  {e['prefix']}…  scopes={','.join(e['scopes'])}  "
                f"created={e['createdAt']}  last_used={e['lastUsedAt'] or 'never'}  "
                f"expires={e['expiresAt'] or 'never'}  {state}"
            )

    def _revoke(self, name: str, *, dry_run: bool) -> None:
        if dry_run:
            row = ApiToken.objects.filter(name=name.strip()).first()
            if row is None:
                raise CommandError(f"no token named {name!r}")
            verb = "already revoked" if row.revoked_at else "would revoke"
            self.stdout.write(f"api_token: {verb} {row.name} ({row.prefix}…)")
            return
        was_live = ApiToken.objects.filter(
            name=name.strip(), revoked_at__isnull=True
        ).exists()
        row = api_token_revoke(name=name, now=timezone.now())
        verb = "revoked" if was_live else "already revoked"
        self.stdout.write(
            f"api_token: {verb} {row.name} ({row.prefix}…) at {iso(row.revoked_at)}"
        )
