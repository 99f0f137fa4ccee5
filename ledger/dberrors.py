"""Which database errors pass, and which one means the database is gone.

A drain (and anything else that retries work later) must tell apart:
- an error that can pass: the connection was lost, the server is shutting down or out of
  connections, a serialization failure or deadlock, a lock or statement timeout, SQLite's
  busy/locked database. Retrying the same work later can succeed, so its row stays open;
- an error that will come back every time for this input (a value too large for an index,
  a constraint, bad data): retrying forever helps nobody, so the row is marked failed.
`connection_lost` is the subset after which no further statement on this connection can
succeed, and `writes_refused` the subset after which no write can succeed for now (a full
disk, a read-only database): a drain stops at either instead of failing every remaining
candidate in turn. Only an error that does not pass is the row's own.
"""

from __future__ import annotations

from django.db import DatabaseError, InterfaceError, OperationalError

# SQLSTATE classes and codes (PostgreSQL) of errors that can pass.
_PASSING_CLASSES = ("08", "40", "53", "57")  # connection, rollback, resources, operator
_PASSING_CODES = ("55P03", "25006")  # lock_not_available, read_only_sql_transaction
_REFUSED_CODES = ("53100", "25006")  # disk_full, read_only_sql_transaction
_LOST_CLASSES = ("08",)
# admin/crash shutdown, cannot connect now, too many connections (for the server or a role)
_LOST_CODES = ("57P01", "57P02", "57P03", "53300")
# SQLite reports no SQLSTATE: these messages are the passing ones.
_SQLITE_REFUSED = (
    "database or disk is full",
    "readonly database",
    "disk i/o error",
    "database disk image is malformed",  # damaged: no write is the row's fault
    "file is not a database",
)
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
    if not isinstance(exc, OperationalError):
        return False
    code = _sqlstate(exc)
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
