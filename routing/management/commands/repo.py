"""Map GitHub repositories to their checkouts, so their issues come in as todos tasks
(docs/github-intake.md).

    repo add OWNER/NAME --project-path PATH [--intake-label LABEL] [--update] [--dry-run] [--json]
    repo list [--json]
    repo remove OWNER/NAME [--dry-run] [--json]

`add` checks everything before it writes (routing.github_intake.github_repo_clean, the
admin's check too): the name as GitHub names repositories, the project path as a route
admits it (inside LOOPSWEB_PROJECT_ROOTS, or the hosts' roots; the project it resolves to is
kept), the label (1-50 characters, no control character; default `auto:route`). A name
mapped already (compared without case) is refused unless `--update`, which changes its path
and, when given, its label. `remove` unmaps: the inbox rows and work items its issues made
stay. Bad input: one line, exit 1, nothing written.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from domain.errors import ApplicationError
from ledger.management.terminal import TerminalCommand
from routing.github_intake import (
    github_repo_remove,
    github_repo_save,
    github_repo_to_dict,
)
from routing.models import DEFAULT_INTAKE_LABEL, GithubRepo


class Command(TerminalCommand):
    help = "Map GitHub repositories to project paths: their labelled issues become todos tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="map a repository to its project path")
        add.add_argument("full_name", metavar="OWNER/NAME")
        add.add_argument(
            "--project-path",
            required=True,
            help="the repository's checkout, inside LOOPSWEB_PROJECT_ROOTS",
        )
        add.add_argument(
            "--intake-label",
            help=f"the label that brings an issue in (default {DEFAULT_INTAKE_LABEL})",
        )
        add.add_argument(
            "--update",
            action="store_true",
            help="change the mapping when the repository is mapped already",
        )
        listing = actions.add_parser("list", help="list the mapped repositories")
        remove = actions.add_parser("remove", help="unmap a repository")
        remove.add_argument("full_name", metavar="OWNER/NAME")
        for sub in (add, remove):
            sub.add_argument(
                "--dry-run",
                action="store_true",
                help="check and say what would happen, change nothing",
            )
        for sub in (add, listing, remove):
            sub.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except ApplicationError as exc:
            raise CommandError(str(exc)) from None

    def _emit(self, options: dict[str, Any], value: Any, line: str) -> None:
        self.stdout.write(
            json.dumps(value, sort_keys=True) if options["json"] else line
        )

    def _add(self, options: dict[str, Any]) -> None:
        row, verb = github_repo_save(
            full_name=options["full_name"],
            project_path=options["project_path"],
            intake_label=options["intake_label"],
            update=options["update"],
            dry_run=options["dry_run"],
        )
        if options["dry_run"] and verb != "unchanged":
            verb = {"added": "would add", "updated": "would update"}[verb]
        self._emit(
            options,
            {
                "result": verb,
                "dryRun": options["dry_run"],
                "repo": github_repo_to_dict(row),
            },
            f"repo: {verb} {row.full_name} -> {row.project_path} "
            f"(intake label {row.intake_label!r})",
        )

    def _list(self, options: dict[str, Any]) -> None:
        rows = [
            github_repo_to_dict(row) for row in GithubRepo.objects.order_by("full_name")
        ]
        if options["json"]:
            self.stdout.write(json.dumps(rows, sort_keys=True))
            return
        if not rows:
            self.stdout.write(
                "repo: no repositories mapped (repo add OWNER/NAME --project-path PATH)"
            )
        for row in rows:
            self.stdout.write(
                f"{row['fullName']}  {row['projectPath']}  label={row['intakeLabel']!r}"
            )

    def _remove(self, options: dict[str, Any]) -> None:
        row = github_repo_remove(
            full_name=options["full_name"], dry_run=options["dry_run"]
        )
        verb = "would remove" if options["dry_run"] else "removed"
        self._emit(
            options,
            {
                "result": verb,
                "dryRun": options["dry_run"],
                "repo": github_repo_to_dict(row),
            },
            f"repo: {verb} {row.full_name} ({row.project_path})",
        )
