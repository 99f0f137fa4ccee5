"""Manage the account registry: which accounts exist, for which provider, whether they may be
assigned, their running cap and the environment that selects their login.

`add NAME --provider P [--env KEY=VALUE ...] [--max-running N] [--notes TEXT] [--dry-run]`,
`list [--json]`, `disable NAME`, `enable NAME`, `remove NAME [--dry-run]`. The environment
says where the provider's CLI keeps the login (`CODEX_HOME=/srv/agents/acctA/codex`); keys
that look like secrets are refused.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from domain.bounds import option_type
from domain.errors import ApplicationError
from ledger import services
from ledger.models import Account
from ledger.providers import ADAPTERS, PROVIDERS


def _iso(value: Any) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


class Command(BaseCommand):
    help = "Manage the account registry: add, list, disable, enable, remove."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="register an account")
        add.add_argument("name")
        add.add_argument("--provider", required=True, choices=PROVIDERS)
        add.add_argument(
            "--env",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a variable that selects the login (repeat for several)",
        )
        add.add_argument(
            "--max-running", type=option_type("--max-running"), default=None
        )
        add.add_argument("--notes", default="")
        add.add_argument("--dry-run", action="store_true", help="check, write nothing")
        add.add_argument("--json", action="store_true", help="print JSON")
        listing = actions.add_parser("list", help="list accounts")
        listing.add_argument("--json", action="store_true", help="print JSON")
        for verb in ("disable", "enable"):
            sub = actions.add_parser(verb, help=f"{verb} an account")
            sub.add_argument("name")
            sub.add_argument("--json", action="store_true", help="print JSON")
        remove = actions.add_parser("remove", help="remove an account")
        remove.add_argument("name")
        remove.add_argument(
            "--dry-run",
            action="store_true",
            help="say what would happen, change nothing",
        )
        remove.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "add":
                self._add(options)
            elif action == "list":
                self._list(as_json=options["json"])
            elif action in ("disable", "enable"):
                row, changed = services.account_set_enabled(
                    name=options["name"], enabled=action == "enable"
                )
                verb = f"{action}d" if changed else f"already {action}d"
                self._say(options, f"account: {verb} {row.name}", row, result=verb)
            else:
                dry = options["dry_run"]
                row = services.account_remove(name=options["name"], dry_run=dry)
                verb = "would remove" if dry else "removed"
                self._say(options, f"account: {verb} {row.name}", row, result=verb)
        except ApplicationError as exc:
            raise CommandError(str(exc)) from None

    def _add(self, options: dict[str, Any]) -> None:
        env = services.account_env_parse(options["env"])
        provider = options["provider"]
        row = services.account_add(
            name=options["name"],
            provider=provider,
            env=env,
            max_running=options["max_running"],
            notes=options["notes"],
            dry_run=options["dry_run"],
        )
        variable = ADAPTERS[provider].account_variable
        if variable and variable not in env:
            self.stderr.write(
                f"account: warning: {provider} reads its login from {variable}; without "
                f"--env {variable}=... the step uses the worker's own login"
            )
        verb = "would add" if options["dry_run"] else "added"
        self._say(options, f"account: {verb} {row.name} ({provider})", row, result=verb)

    def _say(
        self, options: dict[str, Any], text: str, row: Account, *, result: str
    ) -> None:
        if options.get("json"):
            self.stdout.write(json.dumps({"result": result, "account": _entry(row)}))
        else:
            self.stdout.write(text)

    def _list(self, *, as_json: bool) -> None:
        entries = [_entry(row) for row in Account.objects.order_by("name")]
        if as_json:
            self.stdout.write(json.dumps(entries))
            return
        if not entries:
            self.stdout.write("account: no accounts")
            return
        for e in entries:
            env = " ".join(f"{k}={v}" for k, v in sorted(e["env"].items())) or "-"
            cap = e["maxRunning"] if e["maxRunning"] is not None else "-"
            state = "enabled" if e["enabled"] else "disabled"
            self.stdout.write(
                f"{e['name']}  provider={e['provider']}  {state}  max_running={cap}  env={env}"
            )


def _entry(row: Account) -> dict[str, Any]:
    return {
        "name": row.name,
        "provider": row.provider,
        "enabled": row.enabled,
        "maxRunning": row.max_running,
        "env": dict(row.env_json or {}),
        "notes": row.notes,
        "createdAt": _iso(row.created_at),
        "updatedAt": _iso(row.updated_at),
    }
