"""Loop status actions (pause, resume, archive, stop, delete) and their cascades to the
loop's work items and runs (docs/upstream.md §2.1).

| action  | loop becomes                         | its items (admitted/running)    | reason          |
|---------|--------------------------------------|---------------------------------|-----------------|
| pause   | `paused`                             | `deferred`                      | `loop paused`   |
| archive | `paused`, archived_at set            | `deferred`                      | `loop archived` |
| stop    | `stopped`                            | `cancelled`                     | `loop stopped`  |
| expire  | `expired`                            | `cancelled`                     | `loop expired`  |
| delete  | row deleted                          | `cancelled`                     | `loop deleted`  |
| resume  | `active` (archived_at cleared)       | its deferred items `admitted`,  | `loop resumed`  |
|         |                                      | each with a new queued run      |                 |

Stop, expire and delete also cancel items the loop had parked (`deferred` and still bound to it: a
paused or archived loop's items; a throttled item is never bound to a loop). Every open run
of the loop is cancelled with the reason as its error: its open steps are cancelled, so the
account they held is free, and after the commit the step's process group is killed on this
host (a runner elsewhere notices at its next lease renewal and kills it there).

A paused or archived loop keeps its generated spec (resume runs it again); stop and delete
archive it as a finished run would (so do expire). Resume restarts the parked items at once, as upstream's
daemon runs a resumed loop: it takes the admission lock but does not re-check the caps (the
items counted as active until they were paused).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from ledger.lock import admission_lock
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    TERMINAL_RUN_STATUSES,
    Loop,
    LoopStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.queue import enqueue_run_workflow
from ledger.reaper import kill_leftovers
from ledger.services.cascade import cancel_locked_run, maybe_archive_spec
from ledger.services.common import (
    LedgerError,
    NotFound,
    append_event,
    lock_run,
    now_or_default,
)
from ledger.services.retries import run_again

PAUSE, RESUME, ARCHIVE, STOP, EXPIRE, DELETE = (
    "pause",
    "resume",
    "archive",
    "stop",
    "expire",
    "delete",
)
LOOP_ACTIONS = (PAUSE, RESUME, ARCHIVE, STOP, EXPIRE, DELETE)

# Upstream reasons (docs/upstream.md §2.1).
LOOP_PAUSED = "loop paused"
LOOP_ARCHIVED = "loop archived"
LOOP_STOPPED = "loop stopped"
LOOP_EXPIRED = "loop expired"
LOOP_DELETED = "loop deleted"
LOOP_RESUMED = "loop resumed"
ACTION_REASONS = {
    PAUSE: LOOP_PAUSED,
    ARCHIVE: LOOP_ARCHIVED,
    STOP: LOOP_STOPPED,
    EXPIRE: LOOP_EXPIRED,
    DELETE: LOOP_DELETED,
    RESUME: LOOP_RESUMED,
}

LOOP_NOT_FOUND = "loop not found: {loop_id}"
LOOP_ACTION_UNKNOWN = "unknown loop action: {action} (use one of {actions})"
LOOP_ACTION_REFUSED = "loop cannot be {done}: {loop_id} status={status}"
DONE = {
    PAUSE: "paused",
    RESUME: "resumed",
    ARCHIVE: "archived",
    STOP: "stopped",
    EXPIRE: "expired",
    DELETE: "deleted",
}


@dataclass
class LoopChange:
    """What a loop action changed (or, dry run, would change)."""

    loop_id: str
    loop_name: str
    action: str
    from_status: str
    to_status: str | None  # None: the loop row was deleted
    reason: str
    items: dict[str, str] = field(default_factory=dict)  # item id -> new status
    cancelled_runs: list[str] = field(default_factory=list)
    new_runs: list[str] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "loopId": self.loop_id,
            "loopName": self.loop_name,
            "action": self.action,
            "fromStatus": self.from_status,
            "toStatus": self.to_status,
            "reason": self.reason,
            "workItems": self.items,
            "cancelledRuns": self.cancelled_runs,
            "newRuns": self.new_runs,
            "killedPids": self.killed_pids,
            "dryRun": self.dry_run,
        }


class _DryRun(Exception):
    def __init__(self, change: LoopChange) -> None:
        self.change = change


def _allowed(loop: Loop, action: str) -> bool:
    archived = loop.archived_at is not None
    if action == PAUSE:
        return loop.status == LoopStatus.ACTIVE and not archived
    if action == ARCHIVE:
        return loop.status in (LoopStatus.ACTIVE, LoopStatus.PAUSED) and not archived
    if action == RESUME:
        return loop.status == LoopStatus.PAUSED
    if action in (STOP, EXPIRE):
        return loop.status in (LoopStatus.ACTIVE, LoopStatus.PAUSED)
    return action == DELETE


def loop_status_change(
    *,
    loop_id: str,
    action: str,
    dry_run: bool = False,
    now: datetime | None = None,
) -> LoopChange:
    """Apply one loop action with its cascade in one transaction (see the module docstring).

    Refused (LedgerError, nothing written): an unknown action, an unknown loop
    (`loop not found: <id>`), or an action the status does not allow
    (`loop cannot be paused: <id> status=stopped`). `dry_run` reports the same change and
    rolls it back; no process is signalled.
    """
    if action not in LOOP_ACTIONS:
        raise LedgerError(
            LOOP_ACTION_UNKNOWN.format(action=action, actions=", ".join(LOOP_ACTIONS))
        )
    now = now_or_default(now)
    reason = ACTION_REASONS[action]
    to_kill: list[tuple[list[WorkflowStepRun], str | None]] = []
    try:
        with transaction.atomic():
            # Items become (in)active and steps stop running: the admission lock first.
            admission_lock()
            loop = (
                Loop.objects.select_for_update(no_key=True).filter(pk=loop_id).first()
            )
            if loop is None:
                raise NotFound(LOOP_NOT_FOUND.format(loop_id=loop_id))
            if not _allowed(loop, action):
                raise LedgerError(
                    LOOP_ACTION_REFUSED.format(
                        done=DONE[action], loop_id=loop.id, status=loop.status
                    )
                )
            change = LoopChange(
                loop_id=loop.id,
                loop_name=loop.name,
                action=action,
                from_status=loop.status,
                to_status=None,
                reason=reason,
                dry_run=dry_run,
            )
            if action == RESUME:
                _resume(loop, change, now)
            else:
                to_kill = _halt(loop, action, change, now)
            if dry_run:
                raise _DryRun(change)
    except _DryRun as rollback:
        return rollback.change
    for steps, claimed_by in to_kill:
        change.killed_pids += kill_leftovers(steps, claimed_by)
    return change


def _halt(
    loop: Loop, action: str, change: LoopChange, now: datetime
) -> list[tuple[list[WorkflowStepRun], str | None]]:
    """pause / archive / stop / delete: the loop's status, its items, then its open runs."""
    reason = change.reason
    parks = action in (PAUSE, ARCHIVE)
    item_status = WorkItemStatus.DEFERRED if parks else WorkItemStatus.CANCELLED
    statuses = list(ACTIVE_WORK_ITEM_STATUSES)
    if not parks:
        statuses.append(WorkItemStatus.DEFERRED)  # items a pause parked on this loop
    items = WorkflowWorkItem.objects.filter(loop_id=loop.id, status__in=statuses)
    change.items = {pk: str(item_status) for pk in items.values_list("id", flat=True)}
    # Upstream's bulk cascade: status, lease cleared, last_reason = the loop reason.
    items.update(
        status=item_status, lease_expires_at=None, last_reason=reason, updated_at=now
    )
    if action == PAUSE:
        loop.status = LoopStatus.PAUSED
    elif action == ARCHIVE:
        loop.archived_from_status = loop.status
        loop.archived_at = now
        loop.status = LoopStatus.PAUSED
    elif action == STOP:
        loop.status = LoopStatus.STOPPED
    elif action == EXPIRE:
        loop.status = LoopStatus.EXPIRED
    loop.next_run_at = None
    if action != DELETE:
        loop.save()
        change.to_status = loop.status
    to_kill: list[tuple[list[WorkflowStepRun], str | None]] = []
    open_runs = (
        WorkflowRun.objects.filter(loop_id=loop.id)
        .exclude(status__in=TERMINAL_RUN_STATUSES)
        .order_by("created_at")
        .values_list("id", flat=True)
    )
    for run_id in list(open_runs):
        run = lock_run(run_id)
        # The items were moved above, so the run's own cascade finds nothing active.
        was_running = cancel_locked_run(
            run,
            reason=reason,
            now=now,
            event_payload={"reason": reason},
            archive=not parks,
        )
        change.cancelled_runs.append(run.id)
        to_kill.append((was_running, run.claimed_by))
    if not parks:
        # Items a pause parked have no open run left to archive their spec: do it here.
        for run_id in (
            WorkflowWorkItem.objects.filter(pk__in=list(change.items))
            .exclude(workflow_run__isnull=True)
            .values_list("workflow_run_id", flat=True)
        ):
            if run_id not in change.cancelled_runs:
                maybe_archive_spec(lock_run(run_id), now)
    if action == DELETE:
        loop.delete()  # items and runs keep their rows; their loop reference is cleared
    return to_kill


def _resume(loop: Loop, change: LoopChange, now: datetime) -> None:
    """resume: the loop is active again and each item it parked runs again at once."""
    if loop.archived_at is not None:
        loop.archived_at = None
        loop.archived_from_status = None
    loop.status = LoopStatus.ACTIVE
    loop.save()
    change.to_status = loop.status
    parked = list(
        WorkflowWorkItem.objects.select_for_update(no_key=True)
        .filter(loop_id=loop.id, status=WorkItemStatus.DEFERRED)
        .exclude(workflow_run__isnull=True)
        .order_by("created_at")
    )
    for item in parked:
        previous = WorkflowRun.objects.get(pk=item.workflow_run_id)
        n = (
            WorkflowRun.objects.filter(
                Q(work_item_id=item.id) & Q(loop_id=loop.id)
            ).count()
            + 1
        )
        again = run_again(
            previous,
            item_id=item.id,
            scheduled_for=None,
            idempotency_key=f"{item.id}:{item.attempts}:resume{n}",
        )
        append_event(
            again.id,
            "created",
            payload={
                "workItemId": item.id,
                "resumeOf": previous.id,
                "reason": LOOP_RESUMED,
            },
        )
        WorkflowWorkItem.objects.filter(pk=item.id).update(
            status=WorkItemStatus.ADMITTED,
            workflow_run_id=again.id,
            last_reason=LOOP_RESUMED,
            updated_at=now,
        )
        change.items[item.id] = str(WorkItemStatus.ADMITTED)
        change.new_runs.append(again.id)
        enqueue_run_workflow(again.id)
