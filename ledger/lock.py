"""The admission lock (docs/design.md rule 2), and the drain lock (one drain per scope at a time).

Every write that makes a work item active or a step run running calls `admission_lock()`
first, inside its transaction:
  - PostgreSQL: `pg_advisory_xact_lock` on one admission key, released at commit/rollback.
    One key rather than one per cap dimension: it cannot forget a dimension (locking only the
    scope over-admits on the cross-route project cap, as measured) and it measured as fast.
  - SQLite: nothing to do. `transaction_mode: IMMEDIATE` already took the database write lock
    at BEGIN, so deciding transactions are serialised.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connections

# Namespace for our advisory locks (the two-int form keeps clear of other users' keys).
ADVISORY_NAMESPACE = 4242
ADMISSION_KEY = 1


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
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)",
                [ADVISORY_NAMESPACE, ADMISSION_KEY],
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
