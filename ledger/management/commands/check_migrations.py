"""Check that migrations are safe to deploy, and show the plan on one database.

Fails (exit 1) when a released migration was edited or removed, models changed without a
migration, a migration cannot be reversed, a migration after the first release is not additive
(without a recorded reason), or the database was migrated by a newer release with a breaking
migration. Unknown but additive newer migrations are warnings. The rules are documented in
`ledger.migration_checks`. Read-only: it never writes to the database or the lock file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from ledger.management.terminal import OperatorCommand
from ledger.migration_checks import OUR_APPS, Report, check_migrations


class Command(OperatorCommand):
    # No system checks (OperatorCommand): an unrelated system-check error (admin, urls) must
    # not mask or fake a migration finding.
    help = "Check migrations against the lock file and the rules, and show the plan."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--database",
            default="default",
            help="database alias whose plan and history to read (default: default)",
        )
        parser.add_argument(
            "--json", action="store_true", help="print one JSON object instead of text"
        )
        parser.add_argument(
            "--lock-file",
            type=Path,
            default=None,
            help="lock file to check against (default: migrations.lock at the repository root)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        try:
            connections[alias]
        except ConnectionDoesNotExist:
            raise CommandError(f"unknown database alias {alias!r}") from None
        report = check_migrations(database=alias, lock_path=options["lock_file"])
        if options["json"]:
            self.stdout.write(json.dumps(report.to_dict(), indent=2))
        else:
            self._write_text(report)
        if not report.ok:
            raise CommandError(
                f"check_migrations: {len(report.errors)} problem(s): "
                + ", ".join(sorted({f.file for f in report.errors})),
                returncode=1,
            )

    def _write_text(self, report: Report) -> None:
        vendor = connections[report.database].vendor
        self.stdout.write(f"Migration plan on database {report.database!r} ({vendor}):")
        if not report.plan:
            self.stdout.write("  (no plan: see the errors below)")
        released = set(report.released)
        others: dict[str, list[bool]] = {}
        for app in OUR_APPS:
            entries = [p for p in report.plan if p.app == app]
            if entries:
                self.stdout.write(f"  {app}")
            for p in entries:
                mark = "[X]" if p.applied else "[ ]"
                tag = "  (released)" if f"{p.app}/{p.name}.py" in released else ""
                self.stdout.write(f"    {mark} {p.name}{tag}")
        for p in report.plan:
            if p.app not in OUR_APPS:
                others.setdefault(p.app, []).append(p.applied)
        if others:
            summary = ", ".join(
                f"{app} {sum(flags)}/{len(flags)}"
                for app, flags in sorted(others.items())
            )
            self.stdout.write(f"  other apps (applied/total): {summary}")
        pending = sum(not p.applied for p in report.plan)
        for f in report.warnings:
            self.stdout.write(
                self.style.WARNING(f"WARNING [{f.kind}] {f.file}: {f.message}")
            )
        for f in report.errors:
            self.stderr.write(f"ERROR [{f.kind}] {f.file}: {f.message}")
        if report.ok:
            self.stdout.write(
                self.style.SUCCESS(
                    f"check_migrations: OK ({len(released)} released, {pending} pending, "
                    f"{len(report.warnings)} warning(s))"
                )
            )
