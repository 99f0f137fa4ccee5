"""Load Hasna event envelopes into the inbox, in bulk and idempotently.

FILE is JSON (one envelope or an array) or JSON Lines, or - for stdin. Every envelope is
validated first; by default one invalid envelope means nothing is stored and the command
exits 1 listing the bad lines. `--skip-invalid` stores the valid ones and reports the rest.
An envelope that can never route (the checks and words of the API's `warnings`) is stored
with a warning on stderr; `--strict` refuses the input instead (exit 1, nothing stored).
A delivery already in the inbox (same source and id) is counted as duplicate, never stored
twice.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.db import transaction

from domain.errors import ValidationError
from domain.jsontext import loads_limited
from ledger.management.terminal import TerminalCommand
from routing.drains.inbox import IngestRejected, IngestReport, inbox_ingest
from routing.drains.routable import never_routable_warning, never_routes_message

PROGRESS_EVERY = 10_000


def _bounded_lines(
    head: bytes, stream: Any, limit: int, *, skip_max: int
) -> Iterator[bytes | None]:
    """The lines of `head` then `stream`, each read with at most `limit` + 2 bytes in memory.

    A longer line yields None (it is skipped in bounded chunks, never held whole), so a
    hostile 300 MB line costs no more memory than a legal one. Skipping is bounded too: a
    line still without its end after `skip_max` bytes (`/dev/zero`, a file with no newline)
    is a CommandError instead of reading for ever. With `skip_max` 0 the first overlong
    line is the last thing read.
    """
    first = io.BytesIO(head)

    def readline(size: int) -> bytes:
        part = first.readline(size)
        if part.endswith(b"\n") or len(part) >= size:
            return part
        return part + stream.readline(size - len(part))

    number = 0
    while True:
        line = readline(limit + 2)
        if not line:
            return
        number += 1
        if len(line.rstrip(b"\r\n")) <= limit:
            yield line
            continue
        if not skip_max:
            yield None
            return  # the file is refused anyway: read no further
        skipped = len(line)
        while line and not line.endswith(b"\n"):
            if skipped > skip_max:
                raise CommandError(
                    f"line {number} is larger than {limit} bytes (LOOPSWEB_MAX_EVENT_BYTES) "
                    f"and has no end within {skip_max} bytes (LOOPSWEB_MAX_INGEST_BYTES); "
                    "nothing stored"
                )
            line = readline(1 << 16)  # drop the rest of the overlong line
            skipped += len(line)
        yield None


def _watched(
    items: Iterator[tuple[str, object]], warnings: list[dict[str, Any]]
) -> Iterator[tuple[str, object]]:
    """`items` unchanged, each envelope that can never route added to `warnings`."""
    cwd = os.getcwd()
    for position, obj in items:
        if not isinstance(obj, Exception):
            warning = never_routable_warning(position, obj, cwd=cwd)
            if warning is not None:
                warnings.append(warning)
        yield position, obj


class Command(TerminalCommand):
    help = "Load event envelopes (JSON or JSON Lines) into the inbox."
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="JSON or JSON Lines file, or - for stdin")
        parser.add_argument(
            "--skip-invalid",
            action="store_true",
            help="store valid envelopes, report the rest",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="validate and classify, store nothing",
        )
        parser.add_argument(
            "--json", action="store_true", help="print the summary as JSON"
        )
        parser.add_argument(
            "--strict",
            action="store_true",
            help="refuse the input (nothing stored) when an envelope can never route",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["file"]
        # call_command(stdin=...) may hand a bytes stream (no .buffer)
        stdin: Any = options.get("stdin") or sys.stdin
        try:
            stream: IO[bytes] = (
                getattr(stdin, "buffer", stdin) if path == "-" else open(path, "rb")
            )
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        warnings: list[dict[str, Any]] = []
        try:
            items = _watched(
                self._envelopes(stream, skip_invalid=options["skip_invalid"]), warnings
            )
            try:
                # --strict: the whole ingest rolls back when an envelope never routes.
                with transaction.atomic():
                    report = inbox_ingest(
                        items,
                        all_or_nothing=not options["skip_invalid"],
                        dry_run=options["dry_run"],
                        progress=self._progress,
                    )
                    if options["strict"] and warnings:
                        report.stored = False
                        transaction.set_rollback(True)
            except IngestRejected as rejected:
                self._summary(rejected.report, options, warnings)
                raise CommandError(
                    f"{rejected}; nothing stored (use --skip-invalid to store the valid ones)"
                ) from None
        finally:
            if stream is not sys.stdin and path != "-":
                stream.close()
        self._summary(report, options, warnings)
        if options["strict"] and warnings:
            raise CommandError(
                never_routes_message(warnings, flag="--strict") + "; nothing stored"
            )

    def _progress(self, seen: int) -> None:
        if seen >= PROGRESS_EVERY and seen % PROGRESS_EVERY < 1000:
            self.stderr.write(f"ingest_events: {seen} envelopes read…")

    def _summary(
        self,
        report: IngestReport,
        options: dict[str, Any],
        warnings: list[dict[str, Any]],
    ) -> None:
        if options["json"]:
            self.stdout.write(json.dumps({**report.to_dict(), "warnings": warnings}))
            return
        verb = (
            "would store"
            if options["dry_run"]
            else ("stored" if report.stored else "stored nothing")
        )
        self.stdout.write(
            f"ingest_events: new={len(report.new)} duplicate={len(report.duplicate)} "
            f"invalid={len(report.invalid)} ({verb})"
        )
        for bad in report.invalid[:50]:
            self.stdout.write(f"  invalid {bad['at']}: {bad['error']}")
        if len(report.invalid) > 50:
            self.stdout.write(f"  … and {len(report.invalid) - 50} more")
        # The API's `warnings`, in the same words (routing.drains.routable).
        for warning in warnings[:50]:
            self.stderr.write(
                f"  warning {warning['at']} ({warning['source']} {warning['id']}, "
                f"{warning['kind']}): can never route: {warning['warning']}"
            )
        if len(warnings) > 50:
            self.stderr.write(f"  … and {len(warnings) - 50} more warnings")

    def _envelopes(
        self, stream: Any, *, skip_invalid: bool
    ) -> Iterator[tuple[str, object]]:
        """(position, parsed JSON or a ValidationError) for each envelope in the stream.

        An overlong JSON Lines line fails the whole file unless --skip-invalid, so without
        it reading stops there, never past its limit (the report ends with that line); with
        it, the line is skipped up to LOOPSWEB_MAX_INGEST_BYTES while looking for its end."""
        limit = settings.LOOPSWEB_MAX_EVENT_BYTES
        head = stream.read(limit + 1)
        if head.lstrip()[:1] == b"[":
            body = head + stream.read(settings.LOOPSWEB_MAX_INGEST_BYTES)
            if len(body) > settings.LOOPSWEB_MAX_INGEST_BYTES:
                raise CommandError(
                    f"JSON array is larger than {settings.LOOPSWEB_MAX_INGEST_BYTES} bytes; use JSON Lines"
                )
            try:
                values = loads_limited(
                    body, max_depth=settings.LOOPSWEB_MAX_JSON_DEPTH, array_wrapper=True
                )
            except ValidationError as exc:
                raise CommandError(f"file is not valid JSON: {exc}") from None
            for index, value in enumerate(values, start=1):
                yield f"item {index}", value
            return
        if len(head) <= limit:
            # Small input: one (possibly pretty-printed) envelope, or a few JSON lines.
            try:
                whole = loads_limited(head, max_depth=settings.LOOPSWEB_MAX_JSON_DEPTH)
            except ValidationError:
                whole = None  # read it as JSON Lines, reporting each bad line
            if isinstance(whole, dict):
                yield "item 1", whole
                return
        number = 0
        skip_max = settings.LOOPSWEB_MAX_INGEST_BYTES if skip_invalid else 0
        for line in _bounded_lines(head, stream, limit, skip_max=skip_max):
            number += 1
            if line is None:
                yield (
                    f"line {number}",
                    ValidationError(f"envelope is larger than {limit} bytes"),
                )
            elif line.strip():
                yield self._line(number, line, limit)

    @staticmethod
    def _line(number: int, line: bytes, limit: int) -> tuple[str, object]:
        where = f"line {number}"
        if len(line) > limit:
            return where, ValidationError(f"envelope is larger than {limit} bytes")
        try:
            return where, loads_limited(
                line, max_depth=settings.LOOPSWEB_MAX_JSON_DEPTH
            )
        except ValidationError as exc:
            return where, exc
