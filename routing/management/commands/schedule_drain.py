"""Create, update, list or delete scheduled drains (django-q2 schedules).

    schedule_drain NAME KIND (--every 5m | --cron EXPR) [drain options]
    schedule_drain --list [--json]
    schedule_drain --delete NAME

A scheduled drain runs `routing.tasks.drain` with its options; its default --max-active
scope is its NAME (as upstream's daemon exports LOOPS_LOOP_NAME to a scheduled drain loop).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from croniter import croniter
from django.core.management.base import CommandError, CommandParser
from django.db import transaction
from django.utils import timezone
from django_q.models import Schedule

from domain.bounds import BOUNDS, TooLarge, bounded_int
from domain.errors import ValidationError
from ledger.management.terminal import TerminalCommand
from routing.drains.configs import DRAIN_FUNC
from routing.drains.wake import drain_wakes_forget
from routing.management.arguments import (
    add_drain_arguments,
    add_route_arguments,
    drain_options_from_argparse,
)

EVERY = re.compile(r"^\s*(\d+)\s*([mh]?)\s*$")


EVERY_INVALID = "--every must be a positive number of minutes or hours, like 5m or 2h"


def parse_every(text: str) -> int:
    """Minutes from `5`, `5m` or `2h` (django-q2 schedules have minute granularity), at most
    the `--every` bound (domain.bounds) in minutes."""
    match = EVERY.match(text or "")
    if not match:
        raise CommandError(EVERY_INVALID)
    hours = match.group(2) == "h"
    bound = BOUNDS["--every"]
    try:
        value = bounded_int(
            "--every",
            match.group(1),
            maximum=bound.maximum // 60 if hours else bound.maximum,
        )
    except TooLarge:
        raise CommandError(
            f"--every must be at most {bound.maximum}m ({bound.maximum // 60}h)"
        ) from None
    except ValidationError:
        raise CommandError(EVERY_INVALID) from None
    assert value is not None
    return value * 60 if hours else value


class Command(TerminalCommand):
    help = "Create, update, list or delete scheduled drains."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "name", nargs="?", help="schedule name (also the drain's default scope)"
        )
        parser.add_argument("kind", nargs="?", help="todos-task or generic")
        parser.add_argument("--every", help="interval: 5m, 2h")
        parser.add_argument("--cron", help="cron expression, e.g. '*/5 * * * *'")
        parser.add_argument("--list", action="store_true", help="list scheduled drains")
        parser.add_argument(
            "--delete", metavar="NAME", help="delete the scheduled drain NAME"
        )
        add_route_arguments(parser)
        add_drain_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            return self._list(options["json"])
        if options["delete"]:
            with transaction.atomic():
                deleted, _ = Schedule.objects.filter(
                    name=options["delete"], func=DRAIN_FUNC
                ).delete()
                drain_wakes_forget([options["delete"]])
            if not deleted:
                raise CommandError(f"no scheduled drain named {options['delete']!r}")
            self.stdout.write(f"deleted scheduled drain {options['delete']}")
            return
        name, kind = (options["name"] or "").strip(), options["kind"]
        if not name or not kind:
            raise CommandError("give NAME and KIND (or --list / --delete NAME)")
        if bool(options["every"]) == bool(options["cron"]):
            raise CommandError("give exactly one of --every or --cron")
        drain = drain_options_from_argparse(kind, options, name=name)
        if options["cron"]:
            if not croniter.is_valid(options["cron"]):
                raise CommandError(
                    f"--cron is not a valid cron expression: {options['cron']!r}"
                )
            timing: dict[str, Any] = {
                "schedule_type": Schedule.CRON,
                "cron": options["cron"],
                "minutes": None,
            }
        else:
            timing = {
                "schedule_type": Schedule.MINUTES,
                "minutes": parse_every(options["every"]),
                "cron": None,
            }
        stored = drain.to_dict()
        stored.pop("kind")
        kwargs = repr({"kind": kind, "options": stored, "name": name})
        if options["dry_run"]:
            self.stdout.write(f"would schedule drain {name}: {kind} {timing} {stored}")
            return
        with transaction.atomic():
            schedule, created = Schedule.objects.update_or_create(
                name=name,
                defaults={
                    "func": DRAIN_FUNC,
                    "args": None,
                    "kwargs": kwargs,
                    "repeats": -1,
                    "next_run": timezone.now(),
                    **timing,
                },
            )
        verb = "created" if created else "updated"
        self.stdout.write(
            f"{verb} scheduled drain {name} ({kind}, scope {name}), next run {schedule.next_run:%Y-%m-%dT%H:%M:%SZ}"
        )

    def _list(self, as_json: bool) -> None:
        rows = []
        for schedule in Schedule.objects.filter(func=DRAIN_FUNC).order_by("name"):
            try:
                kwargs = ast.literal_eval(schedule.kwargs or "{}")
            except (ValueError, SyntaxError):
                kwargs = {}
            rows.append(
                {
                    "name": schedule.name,
                    "kind": kwargs.get("kind"),
                    "every": f"{schedule.minutes}m"
                    if schedule.schedule_type == Schedule.MINUTES
                    else None,
                    "cron": schedule.cron,
                    "nextRun": schedule.next_run.isoformat()
                    if schedule.next_run
                    else None,
                    "options": kwargs.get("options", {}),
                }
            )
        if as_json:
            self.stdout.write(json.dumps(rows, sort_keys=True))
            return
        if not rows:
            self.stdout.write(
                "no scheduled drains (create one: schedule_drain NAME KIND --every 5m)"
            )
        for row in rows:
            when = row["every"] or row["cron"]
            self.stdout.write(
                f"{row['name']}\t{row['kind']}\t{when}\tnext {row['nextRun']}\t{row['options']}"
            )
