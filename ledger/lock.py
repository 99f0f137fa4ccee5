"""The admission lock (docs/design.md, "one admission lock"), and the drain lock (one drain
per scope at a time).

Every write that makes a work item active or a step run running calls `admission_lock()`
first, inside its transaction:
  - PostgreSQL: `pg_advisory_xact_lock` on one admission key, released at commit/rollback.
    One key rather than one per cap dimension: it cannot forget a dimension (locking only the
    scope over-admits on the cross-route project cap, as measured) and it measured as fast.
  - SQLite: nothing to do. `transaction_mode: IMMEDIATE` already took the database write lock
    at BEGIN, so deciding transactions are serialised.

Limits (PostgreSQL), set for the rest of the transaction with the lock itself, in the same
round trip: `idle_in_transaction_session_timeout` (LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS), so a
holder whose process stops or whose network goes away between two statements is ended by the
server and the lock released, and `lock_timeout` (LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS), so a
wait behind a long holder gives up. Both errors pass (ledger.dberrors): the writer tries the
whole transaction again. The transaction's `application_name` names the process
(`loopsweb <pid> <host>`), so /ops/ and /metrics can say who holds the lock (`lock_state`).

What may run under the lock: decisions only (reads and writes of the ledger and the broker
rows). No git, no subprocess, no network, no file system: docs/design.md lists what runs
under it and where the file-system checks went.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, connections

logger = logging.getLogger(__name__)

# Namespace for our advisory locks (the two-int form keeps clear of other users' keys).
ADVISORY_NAMESPACE = 4242
ADMISSION_KEY = 1
# A wait for the lock this long is logged (and /ops/ shows the holder while it lasts).
SLOW_WAIT_SECONDS = 1.0
SLOW_WAIT = "waited {seconds:.1f} s for the admission lock"


class LockOutsideTransaction(RuntimeError):
    pass


def admission_lock(using: str = "default") -> None:
    connection = connections[using]
    if not connection.in_atomic_block:
        # A transaction-level lock outside a transaction would be released at once.
        raise LockOutsideTransaction(
            "admission_lock() must be called inside transaction.atomic()"
        )
    if connection.vendor == "postgresql":
        idle_ms = int(settings.LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS) * 1000
        wait_ms = int(settings.LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS) * 1000
        started = time.monotonic()
        with connection.cursor() as cursor:
            # One round trip (client-side binding sends both statements at once).
            cursor.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, true),"
                " set_config('lock_timeout', %s, true),"
                " set_config('application_name', %s, true);"
                " SELECT pg_advisory_xact_lock(%s, %s)",
                [
                    str(idle_ms),
                    str(wait_ms),
                    holder_name(),
                    ADVISORY_NAMESPACE,
                    ADMISSION_KEY,
                ],
            )
        waited = time.monotonic() - started
        if waited >= SLOW_WAIT_SECONDS:
            logger.warning(SLOW_WAIT.format(seconds=waited))


def holder_name() -> str:
    """How a transaction that takes the lock names itself to the server (63 bytes at most:
    the pid first, so a long host name is what gets cut)."""
    return f"loopsweb {os.getpid()} {settings.LOOPSWEB_HOST_NAME}"[:63]


@dataclass(frozen=True)
class LockState:
    """The admission lock as the server sees it now (PostgreSQL)."""

    holder: str | None  # the holder's host (its application_name's last word), or None
    holder_pid: int | None  # the holder's loopsweb process id
    holder_idle: bool  # the holder is "idle in transaction": its process sends nothing
    held_seconds: float  # how long the holder's transaction has been open
    waiters: int
    longest_wait_seconds: float


def lock_state(using: str = "default") -> LockState | None:
    """Who holds the admission lock and who waits for it (None on SQLite, which has none)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.granted, a.application_name, a.state,"
            " EXTRACT(EPOCH FROM now() - a.xact_start),"
            " EXTRACT(EPOCH FROM now() - a.query_start)"
            " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s"
            # this database's lock only (one server may hold several databases)
            " AND l.database = (SELECT oid FROM pg_database"
            " WHERE datname = current_database())"
            " AND l.objsubid = 2",
            [ADVISORY_NAMESPACE, ADMISSION_KEY],
        )
        rows = cursor.fetchall()
    holder = next((row for row in rows if row[0]), None)
    waits = [float(row[4] or 0) for row in rows if not row[0]]
    name = str(holder[1] or "").split() if holder else []
    return LockState(
        holder=name[2] if len(name) == 3 and name[0] == "loopsweb" else None,
        holder_pid=int(name[1]) if len(name) == 3 and name[1].isdigit() else None,
        holder_idle=bool(holder and str(holder[2]).startswith("idle in transaction")),
        held_seconds=float(holder[3] or 0) if holder else 0.0,
        waiters=len(waits),
        longest_wait_seconds=max(waits, default=0.0),
    )


# --- one drain per scope at a time ------------------------------------------------------------

DRAIN_NAMESPACE = 4243


def _drain_key(route_key: str, scope: str) -> int:
    digest = hashlib.blake2b(f"{route_key}\0{scope}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


@contextmanager
def drain_lock(route_key: str, scope: str, using: str = "default") -> Iterator[bool]:
    """Try to become the one running drain of (route_key, scope); yields whether it did.

    Upstream schedules drains with overlap `skip`: a drain that starts while another of the
    same scope runs does nothing. Concurrent drains of one scope could only race for the same
    candidates, and on SQLite for its one write lock, so the second one steps aside at once.
    This lock saves work; it is not what keeps caps (the admission lock and the inbox claims
    do that), so losing it early (a dropped connection) costs efficiency, never correctness.
      - PostgreSQL: a session-level `pg_try_advisory_lock`, released at the end.
      - SQLite: an exclusive `flock` on a private file next to the database (the OS releases
        it if the process dies). An in-memory database is one process's own: no lock.
    """
    connection = connections[using]
    key = _drain_key(route_key, scope)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", [DRAIN_NAMESPACE, key]
            )
            acquired = bool(cursor.fetchone()[0])
        try:
            yield acquired
        finally:
            if acquired and connection.connection is not None:
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(
                            "SELECT pg_advisory_unlock(%s, %s)", [DRAIN_NAMESPACE, key]
                        )
                except DatabaseError:
                    pass  # a broken session has released its locks already
        return
    name = str(connection.settings_dict.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:"):
        yield True  # an in-memory (or URI-named) database: nothing to lock beside it
        return
    path = f"{name}.drain-{key & 0xFFFFFFFF:08x}.lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    except OSError:
        yield True  # e.g. another user's lock file: run unlocked (the lock only saves work)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock
