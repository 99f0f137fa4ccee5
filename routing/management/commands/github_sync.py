"""Read the open pull requests loopsweb opened and turn their reviews, review comments and
failing checks into revisions, as the webhook would (routing.github_sync; docs/revisions.md,
"The sync"). The `github-sync` schedule runs the same every five minutes; this is for a
one-off pass or a preview (--dry-run)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from ledger.management.terminal import OperatorCommand
from routing.github_sync import github_sync


class Command(OperatorCommand):
    help = "Poll the open pull requests loopsweb opened for reviews and failing checks."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="read and report, write nothing"
        )
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        report = github_sync(dry_run=options["dry_run"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict()))
        else:
            verb = "would count" if report.dry_run else "counted"
            self.stdout.write(
                f"{report.pulls} open pull request(s): {report.reads} read(s), "
                f"{report.not_modified} unchanged (304), {verb} {report.findings} "
                "finding(s)"
            )
            for line in report.outcomes:
                self.stdout.write(f"  {line}")
            for line in report.errors:
                self.stderr.write(f"  error: {line}")
        if report.errors and not report.pulls:
            raise CommandError(report.errors[0])
