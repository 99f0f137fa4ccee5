"""Where a work item's current admission began: its last admission (the first one, a
requeue's, an operator's retry: routing/admission/retry.py), as opposed to the runs its
loop made of it since (a loop retry or a try later, whose `created` event names `retryOf`,
ledger/services/retries.py; a loop's resume, `resumeOf`, ledger/services/loops.py).

One notion for two bounds that an operator's retry starts afresh: the re-dispatch count
(ledger/services/retries.py `redispatch_count`) and the runs of a task whose account marks
are counted (ledger/claims.py `task_runs`, docs/windows.md "What a task may claim").
"""

from __future__ import annotations

from typing import Any

from ledger.models import WorkflowEvent


def began_admission(created: dict[str, Any]) -> bool:
    """Whether a run's `created` payload is an admission's: no `retryOf`, no `resumeOf`."""
    return not created.get("retryOf") and not created.get("resumeOf")


def admission_created(item_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(run id, `created` payload) of the item's runs, newest first, down to and including
    the run that began its current admission (`began_admission`); all of them when none
    did. One query."""
    events = (
        WorkflowEvent.objects.filter(
            workflow_run__work_item_id=item_id, event_type="created"
        )
        .order_by("-workflow_run_id")
        .values_list("workflow_run_id", "payload_json")
    )
    found: list[tuple[str, dict[str, Any]]] = []
    for run_id, payload in events:
        created = payload if isinstance(payload, dict) else {}
        found.append((run_id, created))
        if began_admission(created):
            break
    return found


def admission_start(item_id: str) -> str | None:
    """The id of the run that began the item's current admission; None when no run's
    `created` event says (runs without one: every run of the item counts)."""
    created = admission_created(item_id)
    if created and began_admission(created[-1][1]):
        return created[-1][0]
    return None
