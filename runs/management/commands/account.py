"""Manage the account registry: which accounts exist, for which provider, whether they may be
assigned, their running cap and the environment that selects their login.

`add NAME --provider P [--codex-home DIR | --claude-config-dir DIR | --opencode-home DIR]
[--env-file PATH] [--env KEY=VALUE ...] [--max-running N] [--window 5h=TOKENS ...]
[--window-pace] [--notes TEXT] [--dry-run]`, `edit NAME [--window 5h=TOKENS ...]
[--no-windows] [--window-pace | --no-window-pace] [--dry-run]`,
`list [--json]`, `check NAME [--json]`, `disable NAME`, `enable NAME`,
`remove NAME [--dry-run]`.

`--window NAME=TOKENS` gives the account a token budget per rate-limit window (`5h`, `7d`,
`90m`): loopsweb estimates those windows from the tokens its step runs used where the CLI
reports nothing (docs/windows.md §3); `--window-pace` spreads each window over its length
(docs/windows.md §4). `list` prints each account's windows (used, reset,
source, age of the observation; `expired` once the reset has passed), then the names outside
the registry that have windows, with control characters escaped.

The environment says where the provider's CLI keeps the login: `--codex-home DIR` sets
`CODEX_HOME` (its `config.toml` and `auth.json` stay there), `--claude-config-dir DIR` sets
`CLAUDE_CONFIG_DIR`, `--opencode-home DIR` sets `XDG_CONFIG_HOME=DIR/config`,
`XDG_DATA_HOME=DIR/data`, `XDG_CACHE_HOME=DIR/cache` and `XDG_STATE_HOME=DIR/state`
(opencode's config is `DIR/config/opencode/opencode.json`, its credentials
`DIR/data/opencode/auth.json`). `--env KEY=VALUE` adds any other variable; keys that look
like secrets are refused. An API-key login is `--env-file PATH`: a file of `NAME=value`
lines, mode 0600, owned by the user the runner runs as; only the path is stored, and the
runner reads the file when a step on the account starts.

`check NAME` runs the CLI's cheapest self-test with the account's environment (`--version`,
then a login probe, then the smallest real request a step would make) and exits non-zero,
saying what is wrong, when something is. An answered request clears the account's `login
failed` mark (set when a step's login was refused: pool assignment skips the account); a
refused one sets it. `enable NAME` clears the mark too.
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from agents.providers import ADAPTERS, PROVIDERS
from domain.bounds import option_type
from domain.controls import terminal_text
from domain.errors import ApplicationError
from domain.windows import Window
from ledger import services
from ledger.management.terminal import OperatorCommand
from ledger.models import Account
from ledger.windows import window_state
from runs.account_check import account_self_test


def _iso(value: Any) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _add_options(add: ArgumentParser) -> None:
    """`account add`: the name, the provider, the login's environment, the limits."""
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
        "--codex-home", metavar="DIR", help="codex: the account's CODEX_HOME"
    )
    add.add_argument(
        "--claude-config-dir",
        metavar="DIR",
        help="claude: the account's CLAUDE_CONFIG_DIR",
    )
    add.add_argument(
        "--opencode-home",
        metavar="DIR",
        help="opencode: DIR/config, DIR/data, DIR/cache, DIR/state as its XDG dirs",
    )
    add.add_argument(
        "--env-file",
        metavar="PATH",
        help="API-key login: a 0600 file of NAME=value lines (only the path is stored)",
    )
    add.add_argument("--max-running", type=option_type("--max-running"), default=None)
    add.add_argument("--notes", default="")
    add.add_argument("--window", action="append", default=[], help=WINDOW_HELP)
    add.add_argument("--window-pace", action="store_true", help=PACE_HELP)
    add.add_argument("--dry-run", action="store_true", help="check, write nothing")
    add.add_argument("--json", action="store_true", help="print JSON")


def _edit_options(edit: ArgumentParser) -> None:
    """`account edit`: the window budgets and their pacing."""
    edit.add_argument("name")
    edit.add_argument("--window", action="append", default=[], help=WINDOW_HELP)
    edit.add_argument(
        "--no-windows", action="store_true", help="remove every window budget"
    )
    pace = edit.add_mutually_exclusive_group()
    pace.add_argument(
        "--window-pace",
        dest="pace",
        action="store_const",
        const=True,
        help=PACE_HELP,
    )
    pace.add_argument(
        "--no-window-pace",
        dest="pace",
        action="store_const",
        const=False,
        help="stop pacing its windows",
    )
    edit.add_argument("--dry-run", action="store_true", help="check, write nothing")
    edit.add_argument("--json", action="store_true", help="print JSON")


def _clear_options(clear: ArgumentParser) -> None:
    """`account clear`: which of the claims steps' output made to clear."""
    clear.add_argument("name")
    clear.add_argument("--cooldown", action="store_true", help="clear the cooldown")
    clear.add_argument(
        "--windows", action="store_true", help="clear the exhausted windows"
    )
    clear.add_argument(
        "--login", action="store_true", help="clear the login failed mark"
    )
    clear.add_argument(
        "--dry-run",
        action="store_true",
        help="say what would be cleared, clear nothing",
    )
    clear.add_argument("--json", action="store_true", help="print JSON")


class Command(OperatorCommand):
    help = (
        "Manage the account registry: add, edit, list, check, disable, enable, remove."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        _add_options(actions.add_parser("add", help="register an account"))
        _edit_options(
            actions.add_parser("edit", help="change an account's window budgets")
        )
        listing = actions.add_parser("list", help="list accounts")
        listing.add_argument("--json", action="store_true", help="print JSON")
        check = actions.add_parser(
            "check", help="run the CLI's self-test with the account's login"
        )
        check.add_argument("name")
        check.add_argument("--json", action="store_true", help="print JSON")
        for verb in ("disable", "enable"):
            sub = actions.add_parser(verb, help=f"{verb} an account")
            sub.add_argument("name")
            sub.add_argument("--json", action="store_true", help="print JSON")
        _clear_options(
            actions.add_parser(
                "clear",
                help="clear what steps' output claimed: cooldown, exhausted windows, login mark",
            )
        )
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
            elif action == "edit":
                self._edit(options)
            elif action == "list":
                self._list(as_json=options["json"])
            elif action == "check":
                self._check(options)
            elif action == "clear":
                self._clear(options)
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
        provider = options["provider"]
        env = services.login_environment(
            provider,
            {
                "--codex-home": options["codex_home"],
                "--claude-config-dir": options["claude_config_dir"],
                "--opencode-home": options["opencode_home"],
            },
        )
        env.update(services.account_env_parse(options["env"]))
        row = services.account_add(
            name=options["name"],
            provider=provider,
            env=env,
            max_running=options["max_running"],
            notes=options["notes"],
            dry_run=options["dry_run"],
            env_file=options["env_file"],
            window_budgets=services.account_window_budgets(options["window"]),
            window_pace=options["window_pace"],
        )
        variable = ADAPTERS[provider].account_variable
        if variable and variable not in env and not options["env_file"]:
            self.stderr.write(
                f"account: warning: {provider} reads its login from {variable}; without "
                f"it (or --env-file) the step uses the worker's own login"
            )
        verb = "would add" if options["dry_run"] else "added"
        self._say(options, f"account: {verb} {row.name} ({provider})", row, result=verb)

    def _edit(self, options: dict[str, Any]) -> None:
        budgets_given = bool(options["window"]) or options["no_windows"]
        if not budgets_given and options["pace"] is None:
            raise CommandError(
                "account edit: give --window NAME=TOKENS, --no-windows, --window-pace "
                "or --no-window-pace"
            )
        if options["window"] and options["no_windows"]:
            raise CommandError(
                "account edit: --window and --no-windows exclude each other"
            )
        row = services.account_edit(
            name=options["name"],
            window_budgets=services.account_window_budgets(options["window"])
            if budgets_given
            else None,
            window_pace=options["pace"],
            dry_run=options["dry_run"],
        )
        verb = "would edit" if options["dry_run"] else "edited"
        self._say(options, f"account: {verb} {row.name}", row, result=verb)

    def _clear(self, options: dict[str, Any]) -> None:
        chosen = [k for k in ("cooldown", "windows", "login") if options[k]]
        every = not chosen  # none named: all three
        done = services.account_clear(
            name=options["name"],
            cooldown=every or options["cooldown"],
            windows=every or options["windows"],
            login=every or options["login"],
            dry_run=options["dry_run"],
        )
        verb = "would clear" if options["dry_run"] else "cleared"
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "result": verb if done.anything else "nothing to clear",
                        "account": done.name,
                        "cooldownUntil": done.cooldown_until.isoformat()
                        if done.cooldown_until
                        else None,
                        "windows": list(done.windows),
                        "loginFailed": done.login_failed,
                        "unresponsiveUntil": _iso(done.unresponsive_until),
                    }
                )
            )
        else:
            self.stdout.write(f"account: {verb} {done.name}: {done.text()}")

    def _check(self, options: dict[str, Any]) -> None:
        test = account_self_test(name=options["name"])
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "name": test.name,
                        "provider": test.provider,
                        "ok": test.ok,
                        "lines": test.lines,
                    }
                )
            )
        else:
            for line in test.lines:
                self.stdout.write(f"account check {test.name}: {line}")
        if not test.ok:
            raise CommandError(
                f"account {test.name} ({test.provider}) failed its check: "
                + "; ".join(
                    line[len("PROBLEM: ") :]
                    for line in test.lines
                    if line.startswith("PROBLEM: ")
                )
            )

    def _say(
        self, options: dict[str, Any], text: str, row: Account, *, result: str
    ) -> None:
        if options.get("json"):
            self.stdout.write(json.dumps({"result": result, "account": _entry(row)}))
        else:
            self.stdout.write(text)

    def _list(self, *, as_json: bool) -> None:
        now = timezone.now()
        windows = window_state(now=now)
        entries = [
            {**_entry(row), "windows": [w.to_dict() for w in windows.get(row.name, [])]}
            for row in Account.objects.order_by("name")
        ]
        if as_json:
            self.stdout.write(json.dumps(entries))
            return
        # Names with windows but no registry entry: a pool member that runs on the
        # worker's own login records its windows as any account does.
        others = sorted(set(windows) - {e["name"] for e in entries})
        if not entries and not others:
            self.stdout.write("account: no accounts")
            return
        for e in entries:
            self.stdout.write(terminal_text(_registry_line(e)))
            budgets = e["windowBudgets"] or {}
            if budgets:
                listed = " ".join(f"{k}={v}" for k, v in sorted(budgets.items()))
                self.stdout.write(f"  window budgets: {listed}")
            if e["windowPace"]:
                self.stdout.write("  window pace: on")
            self._windows(windows.get(e["name"], []), now)
        if others:
            self.stdout.write(
                "not in the registry (they run on the worker's own login), with windows:"
            )
        for name in others:
            self.stdout.write(terminal_text(name))
            self._windows(windows[name], now)

    def _windows(self, seen: list[Window], now: datetime) -> None:
        if not seen:
            self.stdout.write("  windows: none reported yet")
        for w in seen:
            line = window_line(w.to_dict(), expired=w.over(now))
            self.stdout.write("  " + terminal_text(line))


def _unresponsive(row: Account) -> dict[str, Any]:
    until = row.unresponsive_until
    if until is None or until <= timezone.now():
        return {"unresponsiveUntil": None, "unresponsiveReason": None}
    return {
        "unresponsiveUntil": _iso(until),
        "unresponsiveReason": row.unresponsive_reason,
    }


def _registry_line(e: dict[str, Any]) -> str:
    """`NAME  provider=P  enabled  max_running=N  env=K=V ...` of one registry entry."""
    env = " ".join(f"{k}={v}" for k, v in sorted(e["env"].items())) or "-"
    cap = e["maxRunning"] if e["maxRunning"] is not None else "-"
    state = "enabled" if e["enabled"] else "disabled"
    if e["loginFailedAt"]:
        state += f"  LOGIN FAILED at {e['loginFailedAt']}: {e['loginFailedReason']}"
    if e["unresponsiveUntil"]:
        state += (
            f"  UNRESPONSIVE until {e['unresponsiveUntil']}: {e['unresponsiveReason']}"
        )
    env_file = f"  env_file={e['envFile']}" if e["envFile"] else ""
    return (
        f"{e['name']}  provider={e['provider']}  {state}  max_running={cap}  "
        f"env={env}{env_file}"
    )


WINDOW_HELP = (
    "token budget of a rate-limit window, NAME=TOKENS (5h=2000000); repeatable"
)
PACE_HELP = (
    "spread each window over its length: defer the account (window_paced) while it has "
    "used more of a window than has elapsed"
)


def window_line(w: dict[str, Any], *, expired: bool = False) -> str:
    """`window 5h: 42% used, allowed, resets 2026-…Z (codex rollout, seen 2026-…Z)`; an
    expired one (its reset has passed: it counts for nothing) `window rate_limit: expired,
    was rejected, reset 2026-…Z (…)`."""
    used = f"{w['used'] * 100:.0f}% used" if w["used"] is not None else "used unknown"
    parts = ["expired"] if expired else [used]
    if w["status"]:
        parts.append(f"was {w['status']}" if expired else str(w["status"]))
    if w["resetsAt"]:
        parts.append(f"{'reset' if expired else 'resets'} {w['resetsAt']}")
    seen = f", seen {w['observedAt']}" if w["observedAt"] else ""
    return f"window {w['window']}: {', '.join(parts)} ({w['source']}{seen})"


def _entry(row: Account) -> dict[str, Any]:
    return {
        "name": row.name,
        "provider": row.provider,
        "enabled": row.enabled,
        "maxRunning": row.max_running,
        "env": dict(row.env_json or {}),
        "envFile": row.env_file or None,
        "notes": row.notes,
        "loginFailedAt": _iso(row.login_failed_at),
        "loginFailedReason": row.login_failed_reason,
        # A hang's cool-off while it lasts (ledger.services.cooldowns), else None.
        **_unresponsive(row),
        "windowBudgets": row.window_budgets or None,
        "windowPace": bool(row.window_pace),
        "createdAt": _iso(row.created_at),
        "updatedAt": _iso(row.updated_at),
    }
