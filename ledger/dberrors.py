"""Which database errors pass, and which one means the database is gone.

A drain (and anything else that retries work later) must tell apart:
- an error that can pass: the connection was lost, the server is shutting down or out of
  connections, a serialization failure or deadlock, a lock or statement timeout, a session
  the server ended for idling in a transaction (the admission lock's limit), SQLite's
  busy/locked database. Retrying the same work later can succeed, so its row stays open;
- an error that will come back every time for this input (a value too large for an index,
  a constraint, bad data): retrying forever helps nobody, so the row is marked failed.
`connection_lost` is the subset after which no further statement on this connection can
succeed, and `writes_refused` the subset after which no write can succeed for now (a full
disk, a read-only database): a drain stops at either instead of failing every remaining
candidate in turn. Only an error that does not pass is the row's own.

`retry_passing` is how a writer that holds work in flight (the runner, a drain's record)
waits out a passing error: the same write again, with a growing pause, for a bounded time.
Each write is one transaction, rolled back whole when it fails, so trying it again is safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)
T = TypeVar("T")

RETRYING = (
    "{what}: the database did not take it ({error}); trying again in {pause:.1f} s"
)

# SQLSTATE classes and codes (PostgreSQL) of errors that can pass.
_PASSING_CLASSES = ("08", "40", "53", "57")  # connection, rollback, resources, operator
# lock_not_available (lock_timeout), read_only_sql_transaction, and a session the server
# ended for idling in a transaction or for its transaction's length (ledger.lock)
_PASSING_CODES = ("55P03", "25006", "25P03", "25P04")
_REFUSED_CODES = ("53100", "25006")  # disk_full, read_only_sql_transaction
_LOST_CLASSES = ("08",)
# admin/crash shutdown, cannot connect now, too many connections (for the server or a role),
# a session ended for idling (in a transaction: the admission lock's limit, ledger.lock)
_LOST_CODES = ("57P01", "57P02", "57P03", "53300", "57P05", "25P03", "25P04")
# SQLite reports no SQLSTATE: these messages are the passing ones.
_SQLITE_REFUSED = (
    "database or disk is full",
    "readonly database",
    "disk i/o error",
)
# A damaged SQLite file: nothing is the row's fault, and nothing of loopsweb can go on; the
# error goes up to manage.py, which says so in one line (loopsweb.dbhealth).
_SQLITE_DAMAGED = ("database disk image is malformed", "file is not a database")
_SQLITE_PASSING = ("locked", "busy", "unable to open database", *_SQLITE_REFUSED)


def _sqlstate(exc: BaseException) -> str | None:
    cause = exc.__cause__ or exc.__context__
    code = getattr(cause, "sqlstate", None) or getattr(exc, "sqlstate", None)
    return code if isinstance(code, str) else None


def _is_postgres(exc: BaseException) -> bool:
    cause = exc.__cause__ or exc.__context__
    return type(cause).__module__.startswith("psycopg")


def connection_lost(exc: BaseException) -> bool:
    """True when the connection to the database is gone (or the server refuses new ones)."""
    if isinstance(exc, InterfaceError):
        return True  # "connection already closed"
    code = _sqlstate(exc)
    if isinstance(exc, DatabaseError) and code in _LOST_CODES:
        return True  # psycopg raises a session ended for idling as an InternalError
    if not isinstance(exc, OperationalError):
        return False
    if code is None:
        # psycopg raises OperationalError without a SQLSTATE when the server is unreachable
        # or closed the connection; SQLite never loses a connection.
        return _is_postgres(exc)
    return code[:2] in _LOST_CLASSES or code in _LOST_CODES


def error_passes(exc: BaseException) -> bool:
    """True when retrying the same work later can succeed (see the module docstring)."""
    if not isinstance(exc, DatabaseError):
        return False
    if connection_lost(exc):
        return True
    code = _sqlstate(exc)
    if code is not None:
        return code[:2] in _PASSING_CLASSES or code in _PASSING_CODES
    if isinstance(exc, OperationalError) and not _is_postgres(exc):
        message = str(exc).lower()
        return any(text in message for text in _SQLITE_PASSING)
    return False


def writes_refused(exc: BaseException) -> bool:
    """True when the database takes no write for now, whatever the row: a full disk, a
    read-only database (or PostgreSQL standby), a failing disk."""
    if not isinstance(exc, DatabaseError):
        return False
    code = _sqlstate(exc)
    if code is not None:
        return code in _REFUSED_CODES
    if _is_postgres(exc):
        return False
    message = str(exc).lower()
    return any(text in message for text in _SQLITE_REFUSED)


def database_damaged(exc: BaseException) -> bool:
    """True when the SQLite file itself is damaged (loopsweb.dbhealth reports it)."""
    return isinstance(exc, DatabaseError) and any(
        text in str(exc).lower() for text in _SQLITE_DAMAGED
    )


def first_line(exc: BaseException) -> str:
    """The error's first line (psycopg adds context lines), or its type when it is empty."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def drop_connection() -> None:
    """Forget a connection that may be broken; Django opens a new one on the next query."""
    try:
        connection.close()
    except DatabaseError:
        pass  # already broken: Django forgets it either way


def retry_passing(
    write: Callable[[], T],
    *,
    seconds: float,
    what: str,
    passes: Callable[[BaseException], bool] = error_passes,
) -> T:
    """`write()`, tried again while it fails with an error that `passes`, for up to
    `seconds`; each retry logs one warning naming `what`. The last error is raised when the
    time is up, and any other error at once. A lost connection is dropped before the next
    try (outside a transaction only: inside one, the caller's block must end first)."""
    deadline = time.monotonic() + seconds
    pause = 0.25
    while True:
        try:
            return write()
        except DatabaseError as exc:
            left = deadline - time.monotonic()
            if not passes(exc) or left <= 0 or connection.in_atomic_block:
                raise
            if connection_lost(exc):
                drop_connection()
            pause = min(pause, left)
            logger.warning(
                RETRYING.format(what=what, error=first_line(exc), pause=pause)
            )
            time.sleep(pause)
            pause = min(pause * 2, 5.0)


def write_ledger(what: str, write: Callable[[], T]) -> T:
    """One ledger write of the runner, waiting out an error that passes (runs/runner.py, "a
    database error that passes"): the same write again for up to one lease, then the
    error."""
    from django.conf import settings

    return retry_passing(
        write, seconds=float(settings.LOOPSWEB_RUN_LEASE_SECONDS), what=what
    )


class OutageNotice:
    """One warning line per outage for a process that polls the database (a heartbeat, a
    broker): the first passing error is logged, the next ones are not until a success."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.down = False

    def failed(self, exc: BaseException) -> None:
        if not self.down:
            logger.warning("%s: the database is away (%s)", self.what, first_line(exc))
        self.down = True

    def ok(self) -> None:
        self.down = False


class PassingErrorLine(logging.Filter):
    """A logging filter (settings.LOGGING, on django-q2's logger): a record that carries a
    passing database error (a lost connection, the server away) becomes one line without
    its traceback, and the same line again within QUIET_SECONDS is dropped: an outage is a
    line per process, not a traceback per poll of the scheduler or the monitor."""

    QUIET_SECONDS = 300.0

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self.said: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not error_passes(exc):
            return True
        text = record.getMessage()
        now = time.monotonic()
        if now - self.said.get(text, -self.QUIET_SECONDS) < self.QUIET_SECONDS:
            return False
        self.said[text] = now
        record.msg = f"{text}: the database is away ({first_line(exc)})"
        record.args = None
        record.exc_info = None
        record.exc_text = None
        return True
