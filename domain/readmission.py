"""Re-admission of finished todos-task items (docs/upstream.md §2.5, 0.4.12 behaviour).

Contract, for an existing item found by (route key, idempotency key):
1. ``queued`` / ``deferred`` items are never a dedupe: the caller re-evaluates them.
2. Only ``todos-task`` items in a terminal status (succeeded, failed, dead_letter,
   cancelled) can be re-admitted; everything else that is uncleared dedupes (loopsweb's
   ``needs_human`` too: it waits for a human, not for the task to arrive again).
3. ``attempts >= 8`` keeps deduping (0.4.12 does not dead-letter here).
4. Within ``backoff(attempts)`` of the item's last update it keeps deduping;
   ``backoff(a) = min(30 min, 2 min * 2**max(0, min(a - 1, 10)))``. An unknown
   finish time skips the backoff, as upstream does for an unparseable timestamp.
5. Otherwise requeue with the upstream reason; attempts are preserved and the normal
   admission then makes them ``attempts + 1``.
``now`` is an argument so the rule is testable without a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from domain.keys import TODOS_TASK
from domain.statuses import READMITTABLE_WORK_ITEM_STATES

MAX_TODOS_TASK_ROUTE_REDISPATCHES = 8

READMIT_REASON = (
    "re-admitted from {status}: todos task still actionable after prior run "
    "(attempt {attempt}/{cap})"
)


@dataclass(frozen=True)
class Readmission:
    readmit: bool
    reason: str | None = None


def redispatch_backoff(attempts: int) -> timedelta:
    exponent = max(0, min(attempts - 1, 10))
    return min(timedelta(minutes=30), timedelta(minutes=2) * 2**exponent)


def readmission_decision(
    *,
    route_key: str,
    status: str,
    attempts: int,
    finished_at: datetime | None,
    now: datetime,
) -> Readmission:
    if route_key != TODOS_TASK or status not in READMITTABLE_WORK_ITEM_STATES:
        return Readmission(readmit=False)
    if attempts >= MAX_TODOS_TASK_ROUTE_REDISPATCHES:
        return Readmission(readmit=False)
    if finished_at is not None and now - finished_at < redispatch_backoff(attempts):
        return Readmission(readmit=False)
    return Readmission(
        readmit=True,
        reason=READMIT_REASON.format(
            status=status,
            attempt=attempts + 1,
            cap=MAX_TODOS_TASK_ROUTE_REDISPATCHES,
        ),
    )
