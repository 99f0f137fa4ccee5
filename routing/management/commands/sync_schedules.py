"""Upsert the built-in schedules from routing.drains.schedules by name, in one transaction."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django_q.models import Schedule

from ledger.management.terminal import OperatorCommand
from routing.drains.schedules import SCHEDULES


class Command(OperatorCommand):
    help = "Create or update the built-in django-q2 schedules."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="show what would change, change nothing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        changed = 0
        with transaction.atomic():
            for spec in SCHEDULES:
                current = Schedule.objects.filter(name=spec.name).first()
                wanted = {
                    "func": spec.func,
                    "schedule_type": Schedule.MINUTES,
                    "minutes": spec.minutes,
                }
                if current and all(getattr(current, k) == v for k, v in wanted.items()):
                    continue
                changed += 1
                if not options["dry_run"]:
                    Schedule.objects.update_or_create(name=spec.name, defaults=wanted)
        verb = "would change" if options["dry_run"] else "changed"
        self.stdout.write(f"schedules: {len(SCHEDULES)} built in, {changed} {verb}")
