"""The admission lock (DESIGN rule 2).

Every write that makes a work item active or a step run running calls `admission_lock()`
first, inside its transaction:
  - PostgreSQL: `pg_advisory_xact_lock` on one admission key, released at commit/rollback.
    One key rather than one per cap dimension: it cannot forget a dimension (locking only the
    scope over-admits on the cross-route project cap, as measured) and it measured as fast.
  - SQLite: nothing to do. `transaction_mode: IMMEDIATE` already took the database write lock
    at BEGIN, so deciding transactions are serialised.
"""

from __future__ import annotations

from django.db import connections

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
