"""A drain and a database outage (kept apart from `run` so the drain loop stays readable).

When the connection to the database is lost part-way (the server stopped, restarted or
dropped us):
1. the drain stops at once: the candidates it has not reached stay exactly as they were
   (open rows for a later drain), instead of each one failing in turn against a dead
   connection;
2. its report so far carries the error (`error`), and the command prints it;
3. its record is written once the database is back: the write is retried, with a growing
   pause, for up to LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS; if the database is still away, the
   report says the record could not be stored (`recordError`) and the command exits 1.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError

from ledger.dberrors import (
    connection_lost,
    database_damaged,
    first_line,
    retry_passing,
    writes_refused,
)
from routing.drains.report import DrainReport
from routing.models import DrainRecord

LOST = (
    "database connection lost; stopped with the remaining candidates untouched: {error}"
)
REFUSED = (
    "database refuses writes (free space, or make it writable, then drain again); "
    "stopped with the remaining candidates untouched: {error}"
)
NOT_STORED = "drain record not stored (database unavailable for {seconds} s): {error}"
NOT_WRITABLE = "drain record not stored (the database refuses writes): {error}"


class ConnectionLost(Exception):
    """Raised inside the drain loop to stop it at the first lost connection, or the first
    write the database refuses (`ledger.dberrors.writes_refused`)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def stop_if_connection_lost(exc: BaseException) -> None:
    """Re-raise as ConnectionLost when `exc` means the database connection is gone, or that
    the database takes no write for now."""
    if database_damaged(exc):
        raise exc  # no candidate's fault, and no drain can go on (loopsweb.dbhealth)
    if isinstance(exc, DatabaseError) and (connection_lost(exc) or writes_refused(exc)):
        raise ConnectionLost(exc) from exc


def lost_connection_error(exc: BaseException) -> str | None:
    """The report's error for a drain stopped by a lost connection, else None."""
    if isinstance(exc, ConnectionLost):
        exc = exc.error
    if isinstance(exc, DatabaseError) and connection_lost(exc):
        return LOST.format(error=first_line(exc))
    if isinstance(exc, DatabaseError) and writes_refused(exc):
        return REFUSED.format(error=first_line(exc))
    return None


def record_when_database_back(
    report: DrainReport, record: Callable[[DrainReport], DrainRecord]
) -> None:
    """Store the drain record, waiting for the database when its connection is lost."""
    wait = settings.LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS
    try:
        report.record_id = retry_passing(
            lambda: record(report).id,
            seconds=wait,
            what="the drain record",
            passes=lambda exc: connection_lost(exc) and not writes_refused(exc),
        )
    except DatabaseError as exc:
        if writes_refused(exc):
            report.record_error = NOT_WRITABLE.format(error=first_line(exc))
        elif connection_lost(exc):
            report.record_error = NOT_STORED.format(seconds=wait, error=first_line(exc))
        else:
            raise
