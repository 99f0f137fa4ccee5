"""A drain's record as it goes: a drain killed part-way (SIGKILL, the machine gone) still
leaves the record of what it had admitted.

- At its start (holding its scope's drain lock, ledger.lock) a drain that records itself
  writes its record at once, unfinished (`finished_at` NULL, `error` UNFINISHED), and
  updates it as results come in: at its first result, then at most every
  CHECKPOINT_SECONDS, so a killed drain's record lacks at most that last moment. Its end completes the same record
  (report.drain_record_save).
- Any other unfinished record of its scope is a killed drain's (two drains of one scope never
  run at once: the drain lock), so the drain that starts next completes it: `finished_at`
  then, the error saying it stopped before it finished.
- A checkpoint that the database does not take is one warning line; the drain goes on, and
  its end (drains.outage) stores the record when the database is back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from ledger.dberrors import first_line
from routing.drains.report import DrainReport, drain_record_fields
from routing.models import DrainRecord

logger = logging.getLogger(__name__)

CHECKPOINT_SECONDS = 0.5
UNFINISHED = (
    "the drain stopped before it finished (killed?): this record holds what it had "
    "admitted by its last update"
)


class RecordKeeper:
    def __init__(self, report: DrainReport) -> None:
        self.report = report
        self.last = 0.0
        self.recorded = 0  # results in the record so far

    def start(
        self, progress: Callable[[DrainReport], None] | None
    ) -> Callable[[DrainReport], None]:
        """Write the record (and complete killed drains'); `progress` with checkpoints."""
        report = self.report
        try:
            others = DrainRecord.objects.filter(
                kind=report.route_key,
                route_scope=report.route_scope,
                finished_at__isnull=True,
            )
            completed = others.update(finished_at=timezone.now(), error=UNFINISHED)
            if completed:
                logger.warning(
                    "drain %s: %d record(s) of drains killed part-way completed",
                    report.route_key,
                    completed,
                )
            fields = drain_record_fields(report)
            fields.update(finished_at=None, error=UNFINISHED)
            report.record_id = DrainRecord.objects.create(**fields).id
        except DatabaseError as exc:
            logger.warning(
                "drain %s: no record at its start (%s)",
                report.route_key,
                first_line(exc),
            )

        def watched(report: DrainReport) -> None:
            self.checkpoint(report)
            if progress is not None:
                progress(report)

        return watched

    def checkpoint(self, report: DrainReport) -> None:
        """After a result: the record updated when there is news and it is time."""
        if report.record_id is None or len(report.results) == self.recorded:
            return
        if time.monotonic() - self.last < CHECKPOINT_SECONDS:
            return
        fields: dict[str, Any] = drain_record_fields(report)
        fields.update(finished_at=None, error=UNFINISHED)
        try:
            DrainRecord.objects.filter(
                pk=report.record_id, finished_at__isnull=True
            ).update(**fields)
        except DatabaseError as exc:
            logger.warning(
                "drain %s: its record was not updated (%s)",
                report.route_key,
                first_line(exc),
            )
        self.recorded = len(report.results)
        self.last = time.monotonic()
