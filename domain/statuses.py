"""The work-item statuses (upstream's values, docs/upstream.md §1), defined once: the ledger's
model choices (`ledger.models.statuses.WorkItemStatus`) and status sets are built from these,
and tests/ledger/test_statuses.py ties them."""

from __future__ import annotations

from enum import StrEnum


class WorkItemState(StrEnum):
    QUEUED = "queued"
    DEFERRED = "deferred"
    ADMITTED = "admitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTER = "dead_letter"
    CANCELLED = "cancelled"
    # loopsweb: the item's revisions are spent or its verifier escalated
    # (docs/revisions.md); a human decides what comes next.
    NEEDS_HUMAN = "needs_human"


# Active work occupies a cap slot (docs/upstream.md §1.2).
ACTIVE_WORK_ITEM_STATES: frozenset[str] = frozenset(
    {WorkItemState.ADMITTED, WorkItemState.RUNNING}
)
TERMINAL_WORK_ITEM_STATES: frozenset[str] = frozenset(
    {
        WorkItemState.SUCCEEDED,
        WorkItemState.FAILED,
        WorkItemState.DEAD_LETTER,
        WorkItemState.CANCELLED,
        WorkItemState.NEEDS_HUMAN,
    }
)
# Terminal items a todos source may admit again (domain.readmission): not one that waits
# for a human, whom a task delivered again would not replace.
READMITTABLE_WORK_ITEM_STATES: frozenset[str] = TERMINAL_WORK_ITEM_STATES - {
    WorkItemState.NEEDS_HUMAN
}
# "Uncleared" items dedupe a new delivery, and an upsert never changes their status
# (docs/upstream.md §2.4, §3.2.9); queued/deferred ones are re-evaluated.
UNCLEARED_WORK_ITEM_STATES: frozenset[str] = (
    ACTIVE_WORK_ITEM_STATES | TERMINAL_WORK_ITEM_STATES
)
