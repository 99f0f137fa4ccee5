"""Deliver a run's work again ("Deliver again"; docs/delivery.md): push its branch and open
its pull request as its route says, after a delivery that failed.

    manage.py deliver_run RUN_ID [--json]

Exits non-zero when the run is unknown, its route does not push, its work was discarded or
the delivery failed again (the message is the forge's or git's).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from ledger.management.terminal import TerminalCommand
from ledger.models import WorkflowRun
from runs.delivery import deliver_run, redeliverable

RUN_NOT_FOUND = "run not found: {run_id}"
NOT_REDELIVERABLE = (
    "run {run_id} has nothing to deliver again (its route does not push, its work was "
    "delivered or discarded, it changed nothing, it failed and its route has no "
    "--deliver-failed, or it has not ended)"
)


class Command(TerminalCommand):
    help = "Deliver a run's work again (push its branch, open its pull request)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        run_id = str(options["run_id"]).strip()
        run = WorkflowRun.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(RUN_NOT_FOUND.format(run_id=run_id))
        if not redeliverable(run):
            raise CommandError(NOT_REDELIVERABLE.format(run_id=run_id))
        record = deliver_run(run.id)
        if options["json"]:
            self.stdout.write(json.dumps(record, indent=2))
        else:
            pr = record.get("pr") or {}
            self.stdout.write(
                f"run {run.id}: {record.get('state')}"
                + (
                    f" {record.get('ref')} at {record.get('commit')}"
                    if record.get("commit")
                    else ""
                )
                + (f"; pull request #{pr['number']} {pr['url']}" if pr else "")
            )
        if record.get("state") == "failed":
            raise CommandError(str(record.get("error")))
