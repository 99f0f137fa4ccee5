"""Recount the account loads from the rows; report and repair any drift of the kept counts."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from ledger.management.terminal import OperatorCommand
from ledger.services.account_loads import repair_account_loads


class Command(OperatorCommand):
    help = (
        "Recount running and reserved steps per account from the step and run rows, "
        "compare them with the counts admission reads, and repair any difference."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="report the drift and change nothing (exit 1 when there is drift)",
        )
        parser.add_argument("--json", action="store_true", help="print a JSON report")

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run: bool = options["dry_run"]
        if options["verbosity"] > 1 and not options["json"]:
            self.stdout.write("recounting account loads from the rows...")
        drift = repair_account_loads(dry_run=dry_run)
        if options["json"]:
            report = {
                "dryRun": dry_run,
                "drift": [d.to_dict() for d in drift],
                "repaired": 0 if dry_run else len(drift),
            }
            self.stdout.write(json.dumps(report, indent=2))
        else:
            for d in drift:
                self.stdout.write(
                    f"  {d.account_profile}: kept running={d.kept_running} "
                    f"reserved={d.kept_reserved}, rows running={d.running} "
                    f"reserved={d.reserved}"
                )
            if not drift:
                self.stdout.write("account loads match the rows")
            elif dry_run:
                self.stdout.write(
                    f"{len(drift)} account(s) drifted (dry run: unchanged)"
                )
            else:
                self.stdout.write(f"repaired {len(drift)} account(s)")
        if drift and dry_run:
            raise CommandError("account loads drifted from the rows", returncode=1)
