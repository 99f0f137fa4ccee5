"""Delete drain records that did nothing (considered no candidate, no error) older than the
retention (LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS, or --days). The `prune-empty-drains` schedule
runs the same every hour; this is for a one-off clean-up or a preview (--dry-run)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.utils import timezone

from domain.bounds import option_type
from ledger.management.terminal import OperatorCommand
from routing.drains.retention import drain_records_prune


class Command(OperatorCommand):
    help = "Delete empty drain records older than the retention."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--days",
            type=option_type("--days"),
            default=None,
            help="keep empty records this many days (default: "
            "LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count, delete nothing"
        )
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["days"]
        if days is None:
            days = settings.LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS
        n = drain_records_prune(
            now=timezone.now(), days=days, dry_run=options["dry_run"]
        )
        if options["json"]:
            self.stdout.write(
                json.dumps({"deleted": n, "days": days, "dryRun": options["dry_run"]})
            )
            return
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(f"empty drain records older than {days} days: {verb} {n}")
