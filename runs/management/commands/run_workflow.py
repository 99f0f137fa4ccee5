"""Run one admitted workflow run inline, in this process (operators, debugging, tests).

The same code path as the django-q2 task: claim, run the steps as processes, finalize. SIGTERM
and SIGINT stop the step's process group and exit; the run is then recovered once its lease
expires (or cancel it with the run cancel service).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

from django.core.management.base import CommandError

from ledger.management.terminal import TerminalCommand
from ledger.models import RunStatus, WorkflowRun
from ledger.services import RUN_NOT_FOUND, RUN_NOT_QUEUED
from runs.runner import DB_UNAVAILABLE, LOST, NOT_CLAIMED, run_workflow_run


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds through the runner, which kills the step's process group on the way.
    sys.exit(128 + signum)


class Command(TerminalCommand):
    help = "Run one queued workflow run inline and print its final status."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id", help="id of a queued workflow run")

    def handle(self, *args: Any, **options: Any) -> None:
        run_id: str = options["run_id"]
        run = WorkflowRun.objects.filter(pk=run_id).only("id", "status").first()
        if run is None:
            raise CommandError(RUN_NOT_FOUND.format(run_id=run_id))
        if run.status != RunStatus.QUEUED:
            raise CommandError(RUN_NOT_QUEUED.format(run_id=run_id, status=run.status))
        signal.signal(signal.SIGTERM, _exit_on_signal)
        signal.signal(signal.SIGINT, _exit_on_signal)
        outcome = run_workflow_run(run_id)
        if outcome == DB_UNAVAILABLE:
            # Said in the log (runs.runner._left_as_it_was); nothing more can be read now.
            raise CommandError(f"run {run_id} stopped: the database is unavailable")
        if outcome == NOT_CLAIMED:
            raise CommandError(RUN_NOT_QUEUED.format(run_id=run_id, status="claimed"))
        run = WorkflowRun.objects.get(pk=run_id)
        if outcome == LOST:
            raise CommandError(f"run {run_id} was taken from this worker: {run.status}")
        if run.status != RunStatus.SUCCEEDED:
            raise CommandError(f"run {run_id} {run.status}: {run.error}")
        self.stdout.write(f"run {run_id} {run.status}")
