"""Work items: the admit write that admission calls inside its transaction, and the
operator actions (requeue, retry of a run, cancel, dead-letter).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from domain.errors import ValidationError
from domain.templates import (
    step_account,
)
from ledger.lock import admission_lock
from ledger.models import (
    TERMINAL_RUN_STATUSES,
    Loop,
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.services.account_loads import LoadDelta, apply_load_delta, run_load
from ledger.services.common import (
    CANCELLABLE_STATUSES,
    CLAIMABLE_STATUSES,
    DEAD_LETTERABLE_STATUSES,
    REASON_REQUIRED,
    REQUEUE_REASON_REQUIRED,
    REQUEUEABLE_STATUSES,
    RUN_NOT_FOUND,
    RUN_NOT_LATEST,
    RUN_NOT_RETRYABLE,
    RUN_RETRY_REASON,
    RUN_WITHOUT_WORK_ITEM,
    WORK_ITEM_NOT_CANCELLABLE,
    WORK_ITEM_NOT_CLAIMABLE,
    WORK_ITEM_NOT_DEAD_LETTERABLE,
    WORK_ITEM_NOT_FOUND,
    WORK_ITEM_NOT_REQUEUEABLE,
    LedgerError,
    NotFound,
    append_operator_event,
    now_or_default,
)
from ledger.services.runs import run_cancel
from ledger.signals import work_item_requeued


def run_retry_item(*, run_id: str, reason: str | None = None) -> tuple[str, str]:
    """Which work item a retry of run `run_id` retries, and with what reason: the item of a
    failed, timed-out or cancelled run, which must be the item's latest run (the retry
    checks it under the lock); the reason is `reason` or `retry of workflow run <id>`.
    The retry itself is admission's (routing.admission.retry)."""
    run = WorkflowRun.objects.filter(pk=run_id).first()
    if run is None:
        raise NotFound(RUN_NOT_FOUND.format(run_id=run_id))
    if run.status not in (RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED):
        raise LedgerError(RUN_NOT_RETRYABLE.format(run_id=run.id, status=run.status))
    if not run.work_item_id:
        raise LedgerError(RUN_WITHOUT_WORK_ITEM.format(run_id=run.id))
    return run.work_item_id, reason or RUN_RETRY_REASON.format(run_id=run.id)


# --- work items (operator actions) ------------------------------------------------------------


def _get_item(item_id: str) -> WorkflowWorkItem:
    item = (
        WorkflowWorkItem.objects.select_for_update(no_key=True)
        .filter(pk=item_id)
        .first()
    )
    if item is None:
        raise NotFound(WORK_ITEM_NOT_FOUND.format(item_id=item_id))
    return item


def work_item_requeue(
    *,
    item_id: str,
    reason: str,
    expected_run_id: str | None = None,
    actor: str | None = None,
    action: str = "requeue",
    now: datetime | None = None,
    reopen_inbox: bool = True,
) -> WorkflowWorkItem:
    """Operator requeue (upstream `routes requeue`, 0.4.12 semantics, docs/upstream.md §2.1).

    1. `reason` is mandatory (`routes requeue requires --reason <text>`).
    2. Only from succeeded/failed/dead_letter/cancelled (else
       `workflow work item is not requeueable: <id> status=<status>`; unknown id →
       `workflow work item not found: <id>`).
    3. → `queued`; workflow, loop, workflow_run, lease and next_attempt_at cleared;
       `last_reason` = the reason; attempts kept (the next admission makes them N+1).
    4. Inbox events that produced the item are reopened (`pending`), so the next drain
       routes it again: requeue means "admit this again", and the inbox is how loopsweb
       re-delivers.
    5. With `actor`, the run the item leaves gets `operator_<action>` naming the user and
       the reason (the next run's reason then cannot erase who requeued it).
    6. `reopen_inbox=False` (a retry, which admission runs: it writes the inbox rows
       itself, once): the inbox is not told.
    """
    if not reason or not reason.strip():
        raise ValidationError(REQUEUE_REASON_REQUIRED)
    now = now_or_default(now)
    with transaction.atomic():
        # Before the item's row: a drain holds this lock when it locks the item's inbox row
        # and then the item, so taking it first here keeps the two from deadlocking.
        admission_lock()
        item = _get_item(item_id)
        if item.status not in REQUEUEABLE_STATUSES:
            raise LedgerError(
                WORK_ITEM_NOT_REQUEUEABLE.format(item_id=item.id, status=item.status)
            )
        if expected_run_id is not None and item.workflow_run_id != expected_run_id:
            raise LedgerError(
                RUN_NOT_LATEST.format(item_id=item.id, run_id=expected_run_id)
            )
        append_operator_event(
            item.workflow_run_id, action, actor=actor, reason=reason.strip()
        )
        item.requeue(reason.strip())
        # The inbox (routing) reopens the events that produced the item: requeue means
        # "admit this again", and the inbox is how loopsweb re-delivers.
        if reopen_inbox:
            work_item_requeued.send(sender=WorkflowWorkItem, item=item, now=now)
    return item


def work_item_cancel(
    *,
    item_id: str,
    reason: str,
    actor: str | None = None,
    now: datetime | None = None,
) -> WorkflowWorkItem:
    """Cancel a work item that is queued, deferred, admitted or running.

    A bound run that is not terminal is cancelled with it (`run_cancel`, which also cancels
    the item). Otherwise the item alone → `cancelled` with the reason and its lease cleared.
    Terminal items → `workflow work item is not cancellable: <id> status=<status>`.
    """
    if not reason or not reason.strip():
        raise ValidationError(REASON_REQUIRED)
    now = now_or_default(now)
    with transaction.atomic():
        item = _get_item(item_id)
        if item.status not in CANCELLABLE_STATUSES:
            raise LedgerError(
                WORK_ITEM_NOT_CANCELLABLE.format(item_id=item.id, status=item.status)
            )
        open_run = (
            WorkflowRun.objects.filter(work_item_id=item.id)
            .exclude(status__in=TERMINAL_RUN_STATUSES)
            .values_list("id", flat=True)
            .first()
        )
    if open_run is not None:
        # Runs are locked before items (lock order), so the run cancel is its own transaction.
        try:
            run_cancel(run_id=open_run, reason=reason.strip(), actor=actor, now=now)
        except LedgerError:
            pass  # it ended meanwhile; cancel the item below if it is still open
    with transaction.atomic():
        item = _get_item(item_id)
        if item.status in CANCELLABLE_STATUSES:
            item.status = WorkItemStatus.CANCELLED
            item.lease_expires_at = None
            item.last_reason = reason.strip()
            item.save()
    return item


def work_item_dead_letter(
    *,
    item_id: str,
    reason: str,
    actor: str | None = None,
    now: datetime | None = None,
) -> WorkflowWorkItem:
    """Park a work item as `dead_letter` until an operator requeues it.

    From queued, deferred, succeeded, failed or cancelled; an admitted or running item must be
    cancelled first (`workflow work item is not dead-letterable: <id> status=<status>`).
    next_attempt_at and lease cleared, `last_reason` = reason. A dead-lettered item dedupes
    every later delivery of its event (it is in upstream's KEEP set).
    """
    if not reason or not reason.strip():
        raise ValidationError(REASON_REQUIRED)
    with transaction.atomic():
        item = _get_item(item_id)
        if item.status not in DEAD_LETTERABLE_STATUSES:
            raise LedgerError(
                WORK_ITEM_NOT_DEAD_LETTERABLE.format(
                    item_id=item.id, status=item.status
                )
            )
        if item.status in (
            WorkItemStatus.SUCCEEDED,
            WorkItemStatus.FAILED,
            WorkItemStatus.CANCELLED,
        ):
            # a finished item's (terminal) run records who parked it
            append_operator_event(
                item.workflow_run_id, "dead_letter", actor=actor, reason=reason.strip()
            )
        item.status = WorkItemStatus.DEAD_LETTER
        item.next_attempt_at = None
        item.lease_expires_at = None
        item.last_reason = reason.strip()
        item.save()
    return item


ONE_SHOT_LOOP_LEASE_MS = 5_400_000


def join_reason(old: str | None, new: str | None) -> str | None:
    """Upstream's reason trail: `old; new` when both are set, else whichever is."""
    if old and new:
        return f"{old}; {new}"
    return new or old


@dataclass
class AdmitRows:
    """The rows one admission writes besides the item (unsaved), and the load they add."""

    loop: Loop
    run: WorkflowRun
    steps: list[WorkflowStepRun]
    event: WorkflowEvent
    load: LoadDelta


def work_item_admit_rows(
    *,
    item: WorkflowWorkItem,
    spec: WorkflowSpec,
    invocation: WorkflowInvocation,
    loop_name: str,
    loop_description: str,
    reason: str,
    now: datetime,
    max_attempts: int = 1,
    retry_delay_ms: int = 60_000,
) -> AdmitRows:
    """What `work_item_admit` writes, built in memory: `item` is updated (not saved) and the
    loop, run, step runs and event are returned unsaved, for a batch to insert in bulk.

    Only a `queued` or `deferred` item is admitted (else upstream's
    `workflow work item is not claimable: <id> status=<status>`)."""
    if item.status not in CLAIMABLE_STATUSES:
        raise LedgerError(
            WORK_ITEM_NOT_CLAIMABLE.format(item_id=item.id, status=item.status)
        )
    loop = Loop(
        name=loop_name,
        description=loop_description,
        schedule_json={"type": "once", "at": (now + timedelta(seconds=1)).isoformat()},
        target_json={
            "type": "workflow",
            "workflowId": spec.id,
            "input": {
                "workflowInvocationId": invocation.id,
                "workflowWorkItemId": item.id,
            },
        },
        overlap="skip",
        max_attempts=max_attempts,
        retry_delay_ms=retry_delay_ms,
        lease_ms=ONE_SHOT_LOOP_LEASE_MS,
    )
    item.attempts += 1
    item.status = WorkItemStatus.ADMITTED
    item.workflow, item.loop = spec, loop
    item.next_attempt_at = item.lease_expires_at = None
    item.last_reason = join_reason(item.last_reason, reason)
    item.reason_code = None
    run = WorkflowRun(
        workflow=spec,
        workflow_name=spec.name,
        loop=loop,
        invocation=invocation,
        work_item=item,
        idempotency_key=f"{item.id}:{item.attempts}",
        status=RunStatus.QUEUED,
    )
    steps = [
        WorkflowStepRun(
            workflow_run=run,
            step_id=step["id"],
            sequence=index,
            status=StepStatus.PENDING,
            account_profile=step_account(step)[0],
            account_tool=step_account(step)[1],
        )
        for index, step in enumerate(spec.steps_json)
    ]
    event = WorkflowEvent(
        workflow_run=run,
        sequence=1,
        event_type="created",
        payload_json={"workItemId": item.id},
    )
    item.workflow_run = run
    # The new run reserves its first account-carrying step (ledger.services.account_loads).
    return AdmitRows(loop, run, steps, event, run_load(run.status, steps))


def work_item_admit(
    *,
    item: WorkflowWorkItem,
    spec: WorkflowSpec,
    invocation: WorkflowInvocation,
    loop_name: str,
    loop_description: str,
    reason: str,
    now: datetime,
    max_attempts: int = 1,
    retry_delay_ms: int = 60_000,
) -> tuple[Loop, WorkflowRun]:
    """Admit a queued/deferred item onto `spec` (docs/upstream.md §2.1, §3.6: "The one-shot
    loop is created", "The item is admitted").

    Call inside the admission transaction, after `admission_lock()`:
    0. only a `queued` or `deferred` item (else upstream's
       `workflow work item is not claimable: <id> status=<status>`);
    1. a one-shot loop (`once` schedule, 90-minute lease) targeting the spec, with the
       route's `max_attempts` (default 1: no retry) and retry delay (`retry_delay_ms`);
    2. the item becomes `admitted`: attempts + 1, bound to spec and loop, reason appended;
    3. a `queued` run with one `pending` step run per step, each carrying the account it will
       use (account_profile / account_tool, docs/upstream.md §2.3), and its `created` event; the item is bound
       to the run so the runner finds it;
    4. the run's reservation is added to the account loads (ledger.services.account_loads).
    """
    rows = work_item_admit_rows(
        item=item,
        spec=spec,
        invocation=invocation,
        loop_name=loop_name,
        loop_description=loop_description,
        reason=reason,
        now=now,
        max_attempts=max_attempts,
        retry_delay_ms=retry_delay_ms,
    )
    rows.loop.save(force_insert=True)
    rows.run.save(force_insert=True)
    WorkflowStepRun.objects.bulk_create(rows.steps)
    rows.event.save(force_insert=True)
    apply_load_delta(rows.load)
    item.save()
    return rows.loop, rows.run
