"""Drain open work through admission (upstream `loops routes drain todos-task`, plus generic).

Exit status 1 when any item hit a non-skippable error (`fatal > 0`), as upstream.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from ledger.dberrors import connection_lost, writes_refused
from ledger.management.terminal import TerminalCommand
from routing.drains import drain_run
from routing.management.arguments import (
    KINDS,
    add_drain_arguments,
    add_route_arguments,
    drain_options_from_argparse,
)


class Command(TerminalCommand):
    help = (
        "Route open inbox events (or a source command's tasks) through admission; "
        "admits one item unless --max-dispatch says more."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", help=f"route kind: {' or '.join(KINDS)}")
        add_route_arguments(parser)
        add_drain_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        drain = drain_options_from_argparse(options["kind"], options)
        tty = sys.stderr.isatty()

        def progress(report: Any) -> None:
            if tty:
                c = report.counts
                self.stderr.write(
                    f"\rconsidered={c['considered']} created={c['created']}", ending=""
                )

        try:
            with queue_log_quiet(options["verbosity"] < 2):
                report = drain_run(options=drain, progress=progress)
        except DatabaseError as exc:
            if not (connection_lost(exc) or writes_refused(exc)):
                raise
            # Before anything was read (the drain lock is its first statement).
            raise CommandError(f"database unavailable: {exc}".strip()) from None
        if tty:
            self.stderr.write("")
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    report.to_dict(compact=drain.compact), sort_keys=True, default=str
                )
            )
        else:
            for line in report.result_lines():
                self.stdout.write(line)
            self.stdout.write(report.human())
            if report.evidence_path:
                self.stdout.write(f"evidence: {report.evidence_path}")
        # The report's last line ends the stdout before anything goes to stderr, so a log
        # or terminal that gets both keeps the two apart and in order.
        self.stdout.flush()
        if report.record_error:
            self.stderr.write(report.record_error)
        if report.error:
            raise CommandError(f"drain failed: {report.error}")
        if report.record_error:
            raise CommandError(report.record_error)
        if report.fatal:
            where = (
                f"see {report.evidence_path}"
                if report.evidence_path
                else (
                    "see the results above"
                    if not options["json"]
                    else "see the results in the JSON report"
                )
            )
            raise CommandError(
                f"route drain hit {report.fatal} non-skippable task error(s); {where}"
            )


@contextmanager
def queue_log_quiet(quiet: bool) -> Iterator[None]:
    """django-q2 logs every run the drain enqueues (`Enqueued [cluster] 17`) at INFO on
    stderr, between the report's lines, which already say what was admitted: while
    `quiet` (below -v 2) only its warnings and errors show."""
    log = logging.getLogger("django-q")
    level = log.level
    if quiet:
        log.setLevel(max(logging.WARNING, level))
    try:
        yield
    finally:
        log.setLevel(level)
