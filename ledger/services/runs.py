"""Workflow runs after admission: claim, lease renewal, finalize, cancel, retry, lease
recovery, and the cascade a run's end makes to its steps, work item, loop and spec.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, Q, TextField, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from domain.errors import ValidationError
from domain.retry import attempts_left, retry_backoff_seconds
from ledger.loads import apply_load_delta, load_change, run_load
from ledger.lock import admission_lock
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    TERMINAL_RUN_STATUSES,
    AccountCooldown,
    LoopStatus,
    RunStatus,
    SpecStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.queue import enqueue_run_workflow
from ledger.services.common import (
    ARCHIVE_REASON,
    CANCEL_REASON_DEFAULT,
    GENERATED_TEMPLATES_BY_ROUTE_KEY,
    LEASE_EXPIRED_ITEM_REASON,
    LEASE_EXPIRED_RUN_ERROR,
    LEASE_EXPIRED_STEP_ERROR,
    OPEN_STEP_STATUSES,
    REASON_REQUIRED,
    RETRY_PENDING_REASON,
    RETRY_PENDING_REASON_WITH_ERROR,
    RUN_ALREADY_TERMINAL,
    RUN_STATUS_NOT_TERMINAL,
    RUNNABLE_STATUSES,
    WORK_ITEM_NOT_RUNNABLE,
    LedgerError,
    append_event,
    clean_text,
    lease_duration,
    lock_run,
    now_or_default,
    to_ms,
)
from ledger.services.processes import kill_leftovers

logger = logging.getLogger(__name__)

# A run that ends with one of these may be retried by its loop (workItemStatusForLoopRun).
RETRYABLE_RUN_STATUSES = (RunStatus.FAILED, RunStatus.TIMED_OUT)

# Most runs handed out again per call of runs_queued_stale (per kind).
STALE_BATCH = 500


def _finish_open_steps(
    run: WorkflowRun,
    *,
    pending_to: str,
    running_to: str,
    error: str | None,
    now: datetime,
) -> list[WorkflowStepRun]:
    """Close the run's pending and running steps; returns the steps that were running.

    The caller ends the run in the same transaction (`end_run`): the load the run put on
    its accounts (running steps, a reservation) is released here, from its steps as they were.
    """
    was_running: list[WorkflowStepRun] = []
    steps = list(
        WorkflowStepRun.objects.filter(workflow_run_id=run.id).order_by("sequence")
    )
    released = run_load(run.status, steps)
    released_delta = load_change(released, run_load(None, []))
    for step in steps:
        if step.status not in OPEN_STEP_STATUSES:
            continue
        if step.status == StepStatus.RUNNING:
            was_running.append(step)
            step.status = running_to
            step.finished_at = now
            step.duration_ms = to_ms(now - step.started_at) if step.started_at else None
            step.error = error
        else:
            # A step that never started gets no error of its own: the run's error explains it.
            step.status = pending_to
        step.save(
            update_fields=[
                "status",
                "finished_at",
                "duration_ms",
                "error",
                "updated_at",
            ]
        )
        append_event(
            run.id,
            f"step_{step.status}",
            step_id=step.step_id,
            payload={"error": step.error} if step.error else None,
        )
    apply_load_delta(released_delta)
    return was_running


def _cascade_work_item(
    run: WorkflowRun, *, status: str, reason: str | None, now: datetime
) -> int:
    """Bulk cascade to the run's work item (reference §2.1): only while it is active.

    `last_reason = COALESCE(new reason, old reason)`; the lease is cleared; bindings stay (the
    item keeps pointing at the run that decided it).
    """
    if not run.work_item_id:
        return 0
    return WorkflowWorkItem.objects.filter(
        Q(workflow_run_id=run.id) | Q(workflow_run__isnull=True),
        pk=run.work_item_id,
        status__in=ACTIVE_WORK_ITEM_STATUSES,
    ).update(
        status=status,
        lease_expires_at=None,
        last_reason=Coalesce(Value(reason, output_field=TextField()), F("last_reason")),
        updated_at=now,
    )


def _close_one_shot_loop(run: WorkflowRun, now: datetime) -> None:
    """A one-shot loop has had its only run: mark it stopped and not due.

    Upstream leaves a fired `once` loop with no next run; `stopped` says so explicitly so
    the loop never shows as active and due. Its items are terminal by now, so the "loop
    stopped → cancel admitted/running items" cascade has nothing to touch.
    """
    loop = run.loop
    if loop is None or loop.status != LoopStatus.ACTIVE:
        return
    schedule = loop.schedule_json if isinstance(loop.schedule_json, dict) else {}
    if schedule.get("type") != "once":
        return
    # One statement: stopped only while no other run of the loop is open.
    other_open = (
        WorkflowRun.objects.filter(loop_id=loop.id)
        .exclude(status__in=TERMINAL_RUN_STATUSES)
        .exclude(pk=run.id)
    )
    type(loop).objects.filter(pk=loop.id, status=LoopStatus.ACTIVE).exclude(
        Exists(other_open)
    ).update(status=LoopStatus.STOPPED, next_run_at=None, updated_at=now)


def maybe_archive_spec(run: WorkflowRun, now: datetime) -> bool:
    """Archive a generated one-shot route spec once its run is terminal (reference §2.3).

    All must hold: the item's route key is todos-task/generic-event; its invocation's template
    is a generated template of that route; the loop is the `once` workflow loop whose input
    names this item and invocation; the item is bound to that loop and spec; no run of the
    spec is still non-terminal. Hand-made workflows never match and are never archived.
    """
    spec = run.workflow
    loop = run.loop
    if spec.status != SpecStatus.ACTIVE or loop is None or not run.work_item_id:
        return False
    if WorkflowRun.work_item.is_cached(run):  # read with the run (`lock_step`)
        item = run.work_item
    else:
        item = (
            WorkflowWorkItem.objects.select_related("invocation")
            .filter(pk=run.work_item_id)
            .first()
        )
    if item is None:
        return False
    templates = GENERATED_TEMPLATES_BY_ROUTE_KEY.get(item.route_key, frozenset())
    if item.invocation.template_id not in templates:
        return False
    schedule = loop.schedule_json if isinstance(loop.schedule_json, dict) else {}
    target = loop.target_json if isinstance(loop.target_json, dict) else {}
    loop_input = target.get("input") if isinstance(target.get("input"), dict) else {}
    if schedule.get("type") != "once" or target.get("type") != "workflow":
        return False
    if target.get("workflowId") not in (None, spec.id):
        return False
    if (
        loop_input.get("workflowWorkItemId") != item.id
        or loop_input.get("workflowInvocationId") != item.invocation_id
    ):
        return False
    if item.loop_id != loop.id or item.workflow_id != spec.id:
        return False
    # One statement: archived only while no run of the spec is open.
    open_runs = WorkflowRun.objects.filter(workflow_id=spec.id).exclude(
        status__in=TERMINAL_RUN_STATUSES
    )
    archived = (
        type(spec)
        .objects.filter(pk=spec.id, status=SpecStatus.ACTIVE)
        .exclude(Exists(open_runs))
        .update(status=SpecStatus.ARCHIVED, updated_at=now)
    )
    if not archived:
        return False
    spec.status = SpecStatus.ARCHIVED
    append_event(
        run.id,
        "workflow_archived",
        payload={
            "workflowId": spec.id,
            "workflowName": spec.name,
            "reason": ARCHIVE_REASON,
        },
    )
    return True


def _work_item_status_for_run(status: str) -> str:
    # A failed or timed-out run with loop attempts left never gets here: `_retry_schedule`
    # already put its item back to `admitted` (workItemStatusForLoopRun).
    if status == RunStatus.SUCCEEDED:
        return WorkItemStatus.SUCCEEDED
    if status == RunStatus.CANCELLED:
        return WorkItemStatus.CANCELLED
    return WorkItemStatus.FAILED


def run_attempt_failures(run: WorkflowRun) -> int:
    """Failed or timed-out runs of this run's admission (same work item and loop)."""
    if not run.work_item_id or not run.loop_id:
        return 0
    return WorkflowRun.objects.filter(
        work_item_id=run.work_item_id,
        loop_id=run.loop_id,
        status__in=RETRYABLE_RUN_STATUSES,
    ).count()


def run_again(
    run: WorkflowRun,
    *,
    item_id: str,
    scheduled_for: datetime | None,
    idempotency_key: str,
    steps: list[WorkflowStepRun] | None = None,
) -> WorkflowRun:
    """A new `queued` run of `run`'s spec, loop and invocation for the item, with one
    `pending` step per step of `run` on the same account, its reservation added to the
    account loads. The caller appends its `created` event, binds the item and enqueues it."""
    if steps is None:
        steps = list(
            WorkflowStepRun.objects.filter(workflow_run_id=run.id).order_by("sequence")
        )
    again = WorkflowRun.objects.create(
        workflow_id=run.workflow_id,
        workflow_name=run.workflow_name,
        loop_id=run.loop_id,
        invocation_id=run.invocation_id,
        work_item_id=item_id,
        scheduled_for=scheduled_for,
        idempotency_key=idempotency_key,
        status=RunStatus.QUEUED,
    )
    new_steps = WorkflowStepRun.objects.bulk_create(
        [
            WorkflowStepRun(
                workflow_run=again,
                step_id=step.step_id,
                sequence=step.sequence,
                status=StepStatus.PENDING,
                account_profile=step.account_profile,
                account_tool=step.account_tool,
            )
            for step in steps
        ]
    )
    # The new run reserves its first account-carrying step (ledger.loads).
    apply_load_delta(run_load(again.status, new_steps))
    return again


def _retry_schedule(
    run: WorkflowRun,
    *,
    status: str,
    error: str | None,
    now: datetime,
    steps: list[WorkflowStepRun] | None = None,
) -> WorkflowRun | None:
    """A loop-level retry (reference §2.1, §2.2): the next attempt of a failed run, or None.

    Only for a failed or timed-out run of an active loop whose item is still active and bound
    to this run, while the admission's failed attempts are fewer than `loop.max_attempts`:
    1. a new `queued` run of the same spec, loop, invocation and item, due after the backoff
       (`scheduled_for`; base `loop.retry_delay_ms`, doubled per failure, capped by
       LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS), with one `pending` step per step of the failed
       run on the same account (a cooling account is waited for, or moved off, at step
       start like any other);
    2. the item stays `admitted` (it never stops counting toward its caps), bound to the new
       run, `last_reason` = `attempt failed; retry pending: <error>`; attempts unchanged;
    3. events: `retry_scheduled` on the failed run, `created` (with attempt and retryOf) on
       the new one; the new run goes to the run queue when this transaction commits.
    The caller holds the admission lock and the run row.
    """
    loop = run.loop
    if (
        status not in RETRYABLE_RUN_STATUSES
        or loop is None
        or loop.status != LoopStatus.ACTIVE
        or loop.archived_at is not None
        or not run.work_item_id
    ):
        return None
    item = (
        WorkflowWorkItem.objects.select_for_update(no_key=True)
        .filter(
            Q(workflow_run_id=run.id) | Q(workflow_run__isnull=True),
            pk=run.work_item_id,
            status__in=ACTIVE_WORK_ITEM_STATUSES,
        )
        .first()
    )
    if item is None:
        return None
    failures = run_attempt_failures(run)
    if not attempts_left(failures=failures, max_attempts=loop.max_attempts):
        return None
    attempt = failures + 1
    delay = retry_backoff_seconds(
        loop.retry_delay_ms / 1000,
        failures,
        float(settings.LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS),
    )
    due = now + timedelta(seconds=delay)
    previous_steps = (
        steps
        if steps is not None
        else list(
            WorkflowStepRun.objects.filter(workflow_run_id=run.id).order_by("sequence")
        )
    )
    rate_limited = AccountCooldown.objects.filter(
        step_run_id__in=[step.id for step in previous_steps]
    ).exists()
    retry = run_again(
        run,
        item_id=item.id,
        scheduled_for=due,
        idempotency_key=f"{item.id}:{item.attempts}:attempt{attempt}",
        steps=previous_steps,
    )
    details = {
        "attempt": attempt,
        "maxAttempts": loop.max_attempts,
        "notBefore": due.isoformat(),
        "rateLimited": rate_limited,
    }
    append_event(
        retry.id,
        "created",
        payload={"workItemId": item.id, "retryOf": run.id, **details},
    )
    append_event(run.id, "retry_scheduled", payload={"retryRunId": retry.id, **details})
    WorkflowWorkItem.objects.filter(pk=item.id).update(
        status=WorkItemStatus.ADMITTED,
        workflow_run_id=retry.id,
        lease_expires_at=None,
        last_reason=RETRY_PENDING_REASON_WITH_ERROR.format(error=error)
        if error
        else RETRY_PENDING_REASON,
        updated_at=now,
    )
    enqueue_run_workflow(retry.id, not_before=due)
    return retry


def end_run(
    run: WorkflowRun,
    *,
    status: str,
    error: str | None,
    item_reason: str | None,
    now: datetime,
    event_payload: dict[str, Any] | None = None,
    archive: bool = True,
    steps: list[WorkflowStepRun] | None = None,
) -> WorkflowRun | None:
    """Set the run terminal and cascade. The caller holds the admission lock and the run row.

    Returns the retry run when a loop-level retry was scheduled. `archive=False` keeps the
    spec (a paused loop runs it again on resume). `steps`: the run's step rows, when the
    caller has them.
    """
    run.status = status
    run.finished_at = now
    run.duration_ms = to_ms(now - run.started_at) if run.started_at else None
    run.error = clean_text(error)
    run.lease_expires_at = None
    run.save(
        update_fields=[
            "status",
            "finished_at",
            "duration_ms",
            "error",
            "lease_expires_at",
            "updated_at",
        ]
    )
    payload = dict(event_payload or {})
    if error:
        payload.setdefault("error", run.error)
    append_event(run.id, status, payload=payload or None)
    retry = _retry_schedule(run, status=status, error=run.error, now=now, steps=steps)
    if retry is None:
        _cascade_work_item(
            run,
            status=_work_item_status_for_run(status),
            reason=item_reason,
            now=now,
        )
    _close_one_shot_loop(run, now)
    # Under the admission lock: an admission reusing this spec by name either committed its
    # run before us (we see it non-terminal and keep the spec) or runs after us (it sees the
    # spec archived and creates a new one). A scheduled retry keeps the spec (non-terminal).
    if archive:
        maybe_archive_spec(run, now)
    return retry


# --- runs -------------------------------------------------------------------------------------


def run_claim(
    *, run_id: str, worker: str, now: datetime | None = None
) -> WorkflowRun | None:
    """Claim a `queued` run for `worker`; None when it is not queued (a second delivery).

    1. Conditional UPDATE queued → running: exactly one row, or nothing happens. A retry
       whose `scheduled_for` (backoff) is still ahead is not claimed either.
    2. The run gets started_at, claimed_by and a lease (LOOPSWEB_RUN_LEASE_SECONDS).
    3. Its work item goes `running` (reference §2.1: from admitted/queued/deferred/running)
       with workflow_run bound and lease_expires_at = now + the loop's lease_ms (upstream).
       An item no longer runnable (an operator ended it) cancels the run instead, with
       upstream's `workflow work item is not runnable` message, and None is returned.
    4. Event `claimed` (loopsweb: upstream runs are created running).
    """
    now = now_or_default(now)
    with transaction.atomic():
        # The admission lock first (lock order; the item becomes `running`). The UPDATE below
        # is the compare-and-set: whoever changes the row owns the run.
        admission_lock()
        # A retry is due at `scheduled_for` (its backoff): never claimed before then.
        claimed = WorkflowRun.objects.filter(
            Q(scheduled_for__isnull=True) | Q(scheduled_for__lte=now),
            pk=run_id,
            status=RunStatus.QUEUED,
        ).update(
            status=RunStatus.RUNNING,
            started_at=now,
            claimed_by=worker,
            lease_expires_at=now + lease_duration(),
            updated_at=now,
        )
        if claimed != 1:
            return None
        run = lock_run(run_id)
        # The item goes `running` with a conditional UPDATE; only when it is no longer
        # runnable is it read, to say why.
        item = None
        if run.work_item_id:
            lease_ms = run.loop.lease_ms if run.loop else None
            claimed_item = WorkflowWorkItem.objects.filter(
                pk=run.work_item_id, status__in=RUNNABLE_STATUSES
            ).update(
                status=WorkItemStatus.RUNNING,
                workflow_run_id=run.id,
                lease_expires_at=now + timedelta(milliseconds=lease_ms)
                if lease_ms
                else run.lease_expires_at,
                updated_at=now,
            )
            if not claimed_item:
                item = WorkflowWorkItem.objects.filter(pk=run.work_item_id).first()
        if item is not None and item.status not in RUNNABLE_STATUSES:
            # The item is ended already: its reason and the steps' stay as they are.
            cancel_locked_run(
                run,
                reason=WORK_ITEM_NOT_RUNNABLE.format(
                    item_id=item.id, status=item.status
                ),
                now=now,
                run_only=True,
            )
            return None
        append_event(
            run.id,
            "claimed",
            payload={
                "claimedBy": worker,
                "leaseExpiresAt": run.lease_expires_at.isoformat()
                if run.lease_expires_at
                else None,
            },
        )
    return run


def run_park(
    *, run_id: str, worker: str, resume_at: datetime, now: datetime | None = None
) -> bool:
    """Hand a running run back to the queue while its next step waits for its account.

    The run stays `running` (its item stays active, its pending steps keep counting toward
    their accounts) but no worker holds it: `claimed_by` is cleared and `lease_expires_at`
    becomes `resume_at`, when its task is due again. Lease recovery leaves such a run alone
    (it has no process to lose); a parked run whose task is lost is handed out again like a
    queued one (`runs_awaiting_task`). False when the run is no longer this worker's.
    """
    now = now_or_default(now)
    with transaction.atomic():
        parked = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by=worker
        ).update(claimed_by=None, lease_expires_at=resume_at, updated_at=now)
    return parked == 1


def run_resume(
    *, run_id: str, worker: str, now: datetime | None = None
) -> WorkflowRun | None:
    """Take a parked run (running, held by no worker) for `worker`; None when it is not parked.

    A conditional UPDATE, like the claim: of two deliveries of the same task, one resumes
    the run and the other changes nothing. The run gets a fresh lease.
    """
    now = now_or_default(now)
    with transaction.atomic():
        resumed = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by__isnull=True
        ).update(
            claimed_by=worker, lease_expires_at=now + lease_duration(), updated_at=now
        )
    if resumed != 1:
        return None
    return WorkflowRun.objects.select_related("workflow").get(pk=run_id)


def run_lease_renew(*, run_id: str, worker: str, now: datetime | None = None) -> bool:
    """Extend a running run's lease; False when the run is no longer this worker's.

    False means it was cancelled, finalized or recovered meanwhile: the runner must stop its
    process and write nothing more for the run. A single conditional UPDATE, so it is cheap
    enough to run every third of a lease.
    """
    now = now_or_default(now)
    with transaction.atomic():
        renewed = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by=worker
        ).update(lease_expires_at=now + lease_duration(), updated_at=now)
    return renewed == 1


def run_worktree_record(
    *,
    run_id: str,
    worker: str,
    path: str | None,
    branch: str | None,
    now: datetime | None = None,
) -> bool:
    """Record (or, with None, clear) a running run's worktree; False when the run is no
    longer this worker's. The runner records it before `git worktree add`, so a worker that
    dies half-way leaves a worktree the prune task knows of."""
    now = now_or_default(now)
    with transaction.atomic():
        updated = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by=worker
        ).update(worktree_path=path, worktree_branch=branch, updated_at=now)
    return updated == 1


def run_worktree_removed(*, run_id: str, now: datetime | None = None) -> None:
    """Mark a run's worktree as gone (after `ledger.worktrees.worktree_remove`)."""
    now = now_or_default(now)
    with transaction.atomic():
        WorkflowRun.objects.filter(pk=run_id, worktree_path__isnull=False).update(
            worktree_removed_at=now
        )


def run_finalize(
    *,
    run_id: str,
    status: str,
    error: str | None = None,
    now: datetime | None = None,
) -> WorkflowRun:
    """End a run with a terminal status and cascade (reference §2.1, §2.3).

    1. Only a non-terminal run (else `RUN_ALREADY_TERMINAL`). Steps still open are closed:
       pending → skipped (cancelled for a cancelled run), running → the run's status.
    2. The run gets status, finished_at, duration_ms, error; its lease is cleared; event
       `<status>`.
    3. Its work item, while admitted/running: succeeded → succeeded, failed/timed_out →
       failed (one-shot loops have max_attempts 1), cancelled → cancelled;
       `last_reason = COALESCE(error, last_reason)`; lease cleared.
    4. A one-shot loop with no other open run → `stopped`, next_run_at cleared.
    5. A generated one-shot route spec is archived (`workflow_archived`, reason
       `terminal generated one-shot route workflow`) when the §2.3 conditions hold.
    """
    if status not in TERMINAL_RUN_STATUSES:
        raise LedgerError(RUN_STATUS_NOT_TERMINAL.format(status=status))
    now = now_or_default(now)
    with transaction.atomic():
        admission_lock()
        run = lock_run(run_id)
        if run.status in TERMINAL_RUN_STATUSES:
            raise LedgerError(
                RUN_ALREADY_TERMINAL.format(run_id=run.id, status=run.status)
            )
        cancelled = status == RunStatus.CANCELLED
        _finish_open_steps(
            run,
            pending_to=StepStatus.CANCELLED if cancelled else StepStatus.SKIPPED,
            running_to=StepStatus.CANCELLED
            if cancelled
            else (
                StepStatus.TIMED_OUT
                if status == RunStatus.TIMED_OUT
                else StepStatus.FAILED
            ),
            error=None,
            now=now,
        )
        end_run(run, status=status, error=error, item_reason=error, now=now)
    return run


def cancel_locked_run(
    run: WorkflowRun,
    *,
    reason: str,
    now: datetime,
    event_payload: dict[str, Any] | None = None,
    archive: bool = True,
    run_only: bool = False,
) -> list[WorkflowStepRun]:
    """Cancel a run the caller locked (under the admission lock): its open steps and the
    run itself cancelled with `reason`, and the cascade. Returns the steps that were
    running (their process groups are the caller's to kill, after commit). `run_only`:
    the reason is the run's error alone, not its running steps' or its item's."""
    was_running = _finish_open_steps(
        run,
        pending_to=StepStatus.CANCELLED,
        running_to=StepStatus.CANCELLED,
        error=None if run_only else reason,
        now=now,
    )
    end_run(
        run,
        status=RunStatus.CANCELLED,
        error=reason,
        item_reason=None if run_only else reason,
        now=now,
        event_payload=event_payload,
        archive=archive,
    )
    return was_running


def run_cancel(
    *,
    run_id: str,
    reason: str = CANCEL_REASON_DEFAULT,
    actor: str | None = None,
    now: datetime | None = None,
) -> WorkflowRun:
    """Cancel a queued or running run (reference §2.3 run cancel).

    Pending/running steps → cancelled, run → cancelled (error = reason), its active work item
    → cancelled with the reason, loop and spec as in `run_finalize`. The runner notices at its
    next lease renewal and kills its process group; if the step's process group is still
    alive on this host it is killed here too (the runner may be gone).
    """
    if not reason or not reason.strip():
        raise ValidationError(REASON_REQUIRED)
    now = now_or_default(now)
    with transaction.atomic():
        admission_lock()
        run = lock_run(run_id)
        if run.status in TERMINAL_RUN_STATUSES:
            raise LedgerError(
                RUN_ALREADY_TERMINAL.format(run_id=run.id, status=run.status)
            )
        was_running = cancel_locked_run(
            run,
            reason=reason,
            now=now,
            # an operator's cancel names the user in the run's `cancelled` event
            event_payload={"reason": reason, **({"user": actor} if actor else {})},
        )
    # After commit: signal processes only once the ledger says the run is over.
    kill_leftovers(was_running, run.claimed_by)
    return run


@dataclass(frozen=True)
class RecoveredRun:
    run_id: str
    workflow_name: str
    claimed_by: str | None
    lease_expires_at: datetime | None
    work_item_id: str | None
    failed_steps: list[str] = field(default_factory=list)
    skipped_steps: list[str] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "workflowName": self.workflow_name,
            "claimedBy": self.claimed_by,
            "leaseExpiresAt": self.lease_expires_at.isoformat()
            if self.lease_expires_at
            else None,
            "workItemId": self.work_item_id,
            "failedSteps": self.failed_steps,
            "skippedSteps": self.skipped_steps,
            "killedPids": self.killed_pids,
        }


def runs_recover_expired(
    *, now: datetime | None = None, dry_run: bool = False
) -> list[RecoveredRun]:
    """Fail `running` runs whose lease expired before `now` (their worker is gone).

    Per run, in its own short transaction (re-checked under the run lock, so a worker that
    renewed meanwhile keeps its run):
    1. running steps → failed, error `worker lease expired before completion (claimed_by=…)`;
       pending steps → skipped.
    2. run → failed with `workflow run lease expired before completion (claimed_by=…)`.
    3. work item (admitted/running) → failed, reason
       `parent loop run lease expired before completion`; loop and spec as in `run_finalize`.
    4. After commit, a step process group still alive on this host is killed.
    Freed: the failed steps no longer count as account load, the item no longer as active.
    Queued runs carry no lease and are never touched. `dry_run` only lists what would change.
    """
    now = now_or_default(now)
    expired = list(
        WorkflowRun.objects.filter(
            status=RunStatus.RUNNING,
            lease_expires_at__lt=now,
            claimed_by__isnull=False,  # parked runs (run_park) hold no process
        )
        .order_by("lease_expires_at")
        .values_list("id", flat=True)
    )
    results: list[RecoveredRun] = []
    for run_id in expired:
        if dry_run:
            run = WorkflowRun.objects.get(pk=run_id)
            steps = list(
                WorkflowStepRun.objects.filter(
                    workflow_run_id=run_id, status__in=OPEN_STEP_STATUSES
                ).order_by("sequence")
            )
            results.append(
                RecoveredRun(
                    run_id=run.id,
                    workflow_name=run.workflow_name,
                    claimed_by=run.claimed_by,
                    lease_expires_at=run.lease_expires_at,
                    work_item_id=run.work_item_id,
                    failed_steps=[
                        s.step_id for s in steps if s.status == StepStatus.RUNNING
                    ],
                    skipped_steps=[
                        s.step_id for s in steps if s.status == StepStatus.PENDING
                    ],
                )
            )
            continue
        recovered = _recover_run(run_id, now)
        if recovered is not None:
            results.append(recovered)
    return results


def _recover_run(run_id: str, now: datetime) -> RecoveredRun | None:
    with transaction.atomic():
        admission_lock()
        run = lock_run(run_id)
        if (
            run.status != RunStatus.RUNNING
            or run.claimed_by is None
            or run.lease_expires_at is None
            or run.lease_expires_at >= now
        ):
            return None  # renewed, parked or finished since the scan
        lease_expires_at = run.lease_expires_at
        claimed_by = run.claimed_by
        pending = list(
            WorkflowStepRun.objects.filter(
                workflow_run_id=run.id, status=StepStatus.PENDING
            ).values_list("step_id", flat=True)
        )
        was_running = _finish_open_steps(
            run,
            pending_to=StepStatus.SKIPPED,
            running_to=StepStatus.FAILED,
            error=LEASE_EXPIRED_STEP_ERROR.format(claimed_by=claimed_by),
            now=now,
        )
        end_run(
            run,
            status=RunStatus.FAILED,
            error=LEASE_EXPIRED_RUN_ERROR.format(claimed_by=claimed_by),
            item_reason=LEASE_EXPIRED_ITEM_REASON,
            now=now,
            event_payload={"recovery": "lease_expired", "claimedBy": claimed_by},
        )
    killed = kill_leftovers(was_running, claimed_by)
    logger.warning(
        "recovered workflow run %s (lease expired %s, claimed_by=%s)",
        run_id,
        lease_expires_at,
        claimed_by,
    )
    return RecoveredRun(
        run_id=run.id,
        workflow_name=run.workflow_name,
        claimed_by=claimed_by,
        lease_expires_at=lease_expires_at,
        work_item_id=run.work_item_id,
        failed_steps=[s.step_id for s in was_running],
        skipped_steps=pending,
        killed_pids=killed,
    )


def runs_queued_stale(
    *,
    older_than: timedelta,
    now: datetime | None = None,
    with_task: Collection[str] = (),
) -> list[str]:
    """Runs waiting for a task that may be gone: ids to enqueue again.

    - `queued` runs untouched for `older_than`;
    - parked runs (`run_park`) whose task was due more than `older_than` ago.
    Runs in `with_task` (the caller saw their task in the broker) are left alone. Each returned
    run is bumped (updated_at, or a parked run's due time), so a run is handed out again at
    most once per window however often this is called; the runner's conditional claim and
    resume make any duplicate delivery a no-op.
    """
    now = now or timezone.now()
    cutoff = now - older_than
    skip = set(with_task)
    with transaction.atomic():
        # Ids only, filtered here: `with_task` can hold thousands of ids (a backlog waiting
        # for run workers), too many for an IN list.
        queued = [
            run_id
            for run_id in WorkflowRun.objects.filter(
                status=RunStatus.QUEUED, updated_at__lt=cutoff
            )
            .order_by("created_at")
            .values_list("id", flat=True)
            if run_id not in skip
        ][:STALE_BATCH]
        WorkflowRun.objects.filter(id__in=queued, status=RunStatus.QUEUED).update(
            updated_at=now
        )
        parked = [
            run_id
            for run_id in WorkflowRun.objects.filter(
                status=RunStatus.RUNNING,
                claimed_by__isnull=True,
                lease_expires_at__lt=cutoff,
            )
            .order_by("lease_expires_at")
            .values_list("id", flat=True)
            if run_id not in skip
        ][:STALE_BATCH]
        WorkflowRun.objects.filter(
            id__in=parked, status=RunStatus.RUNNING, claimed_by__isnull=True
        ).update(lease_expires_at=now, updated_at=now)
    return queued + parked
