"""Loop status actions with upstream's cascades (docs/upstream.md §2.1), and a loop listing.

    loop pause|resume|archive|stop|expire|delete LOOP_ID [--dry-run] [--json]
    loop list [--status S] [--limit N] [--json]

pause / archive park the loop's admitted and running items as `deferred` (`loop paused` /
`loop archived`); stop / expire / delete cancel them (`loop stopped` / `loop expired` /
`loop deleted`); resume runs the
parked items again. A run in progress is cancelled and its agent's process group killed.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from domain.bounds import option_type
from domain.errors import ApplicationError
from ledger.management.terminal import TerminalCommand
from ledger.models import Loop, LoopStatus
from ledger.services import LOOP_ACTIONS, LoopChange, loop_status_change


class Command(TerminalCommand):
    help = "Pause, resume, archive, stop, expire or delete a loop (with its items and runs), or list loops."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        for action in LOOP_ACTIONS:
            sub = actions.add_parser(action, help=f"{action} a loop")
            sub.add_argument("loop_id")
            sub.add_argument(
                "--dry-run",
                action="store_true",
                help="report the change, write nothing",
            )
            sub.add_argument("--json", action="store_true", help="print JSON")
        listing = actions.add_parser("list", help="list loops, newest first")
        listing.add_argument("--status", choices=LoopStatus.values)
        listing.add_argument(
            "--limit", type=option_type("--limit", key="loop --limit"), default=50
        )
        listing.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "list":
            return self._list(options)
        try:
            change = loop_status_change(
                loop_id=options["loop_id"].strip(),
                action=options["action"],
                dry_run=options["dry_run"],
            )
        except ApplicationError as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(change.to_dict(), sort_keys=True))
        else:
            self.stdout.write(self._human(change))

    def _human(self, change: LoopChange) -> str:
        prefix = "dry-run: would " if change.dry_run else ""
        counts: dict[str, int] = {}
        for status in change.items.values():
            counts[status] = counts.get(status, 0) + 1
        items = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
        to = change.to_status or "deleted"
        return (
            f"loop: {prefix}{change.action} {change.loop_id} ({change.loop_name}): "
            f"{change.from_status} -> {to}; work items: {items}; "
            f"runs cancelled: {len(change.cancelled_runs)}; runs started: "
            f"{len(change.new_runs)}; reason: {change.reason}"
        )

    def _list(self, options: dict[str, Any]) -> None:
        if options["limit"] < 1 or options["limit"] > 1000:
            raise CommandError("--limit must be between 1 and 1000")
        loops = Loop.objects.order_by("-created_at", "-id")
        if options["status"]:
            loops = loops.filter(status=options["status"])
        rows = [
            {
                "id": loop.id,
                "name": loop.name,
                "status": loop.status,
                "archivedAt": loop.archived_at.isoformat()
                if loop.archived_at
                else None,
                "maxAttempts": loop.max_attempts,
                "retryDelayMs": loop.retry_delay_ms,
                "createdAt": loop.created_at.isoformat(),
            }
            for loop in loops[: options["limit"]]
        ]
        if options["json"]:
            self.stdout.write(json.dumps(rows, sort_keys=True))
            return
        if not rows:
            self.stdout.write("loop: no loops")
        for row in rows:
            archived = " (archived)" if row["archivedAt"] else ""
            self.stdout.write(
                f"{row['id']}  {row['status']}{archived}  attempts={row['maxAttempts']}  {row['name']}"
            )
