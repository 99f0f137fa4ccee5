"""Fail running workflow runs whose worker lease expired (what the every-minute task does)."""

from __future__ import annotations

import json
from typing import Any

from ledger.management.terminal import TerminalCommand
from ledger.services import runs_recover_expired


class Command(TerminalCommand):
    help = (
        "Recover workflow runs whose lease expired: fail them and free their accounts."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="list what would be recovered, change nothing",
        )
        parser.add_argument("--json", action="store_true", help="print a JSON report")

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run: bool = options["dry_run"]
        recovered = runs_recover_expired(dry_run=dry_run)
        if options["json"]:
            report = {"dryRun": dry_run, "recovered": [r.to_dict() for r in recovered]}
            self.stdout.write(json.dumps(report, indent=2))
            return
        for run in recovered:
            steps = ", ".join(run.failed_steps) or "no running step"
            self.stdout.write(
                f"  {run.run_id} {run.workflow_name} ({steps}) claimed_by={run.claimed_by}"
            )
        verb = "would recover" if dry_run else "recovered"
        self.stdout.write(f"{verb} {len(recovered)} expired run(s)")
