"""Discard a run's work ("Discard"; docs/delivery.md §5): its kept worktree removed, its
branch `loopsweb/run-<id>` deleted in the project, the run marked discarded.

    manage.py discard_run RUN_ID [--json]

Refused (non-zero, nothing changed) for an unknown run, a run that has not ended, or work
discarded already. Never touches a branch that is not the run's.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from domain.errors import ApplicationError
from ledger.management.terminal import TerminalCommand
from runs.discard import discard_run_work


class Command(TerminalCommand):
    help = "Discard a run's work: delete its branch and kept worktree."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            done = discard_run_work(
                str(options["run_id"]).strip(), reason="discarded (command)"
            )
        except ApplicationError as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(done.to_dict(), indent=2))
        else:
            self.stdout.write(
                f"run {done.run_id}: work discarded (branch {done.branch} "
                + ("deleted" if done.deleted else "already gone")
                + (", worktree removed" if done.worktree_removed else "")
                + ")"
            )
