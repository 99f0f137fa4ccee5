"""Release migrations: append every ledger/routing migration not yet in the lock file.

Run it when cutting a release. Each new line is `app/NNNN_name.py <sha256> [reason=TEXT]`;
from then on `check_migrations` fails if that file changes or disappears. It refuses, and
writes nothing, when a migration to be released cannot be reversed, or is not additive without
`--reason APP/NAME=TEXT` (and `breaking` in its name, so older releases can refuse a database
it ran on). Rules: `ledger.migration_checks`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from ledger.management.terminal import OperatorCommand
from ledger.migration_checks import (
    LockFileError,
    append_lock_entries,
    default_lock_path,
    display_path,
    new_lock_entries,
)


def _reason(value: str) -> tuple[str, str]:
    key, sep, text = value.partition("=")
    if not sep or not key.strip() or not text.strip():
        raise ValueError(value)
    return key.strip(), text.strip()


class Command(OperatorCommand):
    # No system checks (OperatorCommand): an unrelated system-check error (admin, urls) must
    # not mask or fake a migration finding.
    help = "Append newly released migrations (with their SHA-256) to the lock file."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print what would be added, write nothing",
        )
        parser.add_argument(
            "--reason",
            action="append",
            default=[],
            metavar="APP/NAME=TEXT",
            help="why a non-additive migration is released anyway (repeatable)",
        )
        parser.add_argument(
            "--lock-file",
            type=Path,
            default=None,
            help="lock file to append to (default: migrations.lock at the repository root)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        lock_path: Path = options["lock_file"] or default_lock_path()
        try:
            reasons = dict(_reason(v) for v in options["reason"])
        except ValueError as exc:
            raise CommandError(
                f"--reason must look like APP/NAME=TEXT, got {exc}"
            ) from None
        try:
            entries, problems = new_lock_entries(lock_path=lock_path, reasons=reasons)
        except LockFileError as exc:
            raise CommandError(f"{display_path(lock_path)}: {exc}") from None
        if problems:
            raise CommandError(
                "refusing to lock:\n" + "\n".join(f"  {p}" for p in problems)
            )
        dry_run = options["dry_run"]
        for entry in entries:
            self.stdout.write(f"{'would add' if dry_run else 'added'}: {entry.line()}")
        if entries and not dry_run:
            try:
                append_lock_entries(lock_path, entries)
            except OSError as exc:
                raise CommandError(
                    f"cannot write {display_path(lock_path)}: {exc.strerror}"
                ) from None
        self.stdout.write(
            f"lock_migrations: {len(entries)} migration(s) "
            f"{'would be added' if dry_run else 'added'} to {display_path(lock_path)}"
        )
