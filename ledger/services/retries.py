"""Loop-level retries (docs/upstream.md §2.1, §2.2): the next attempt of a failed or timed-out
run, as a new queued run of the same spec, loop and item, due after the backoff.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from domain.retry import attempts_left, retry_backoff_seconds
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    AccountCooldown,
    LoopStatus,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.queue import enqueue_run_workflow
from ledger.services.account_loads import apply_load_delta, run_load
from ledger.services.common import (
    RETRY_PENDING_REASON,
    RETRY_PENDING_REASON_WITH_ERROR,
    append_event,
)

# A run that ends with one of these may be retried by its loop (workItemStatusForLoopRun).
RETRYABLE_RUN_STATUSES = (RunStatus.FAILED, RunStatus.TIMED_OUT)


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
    # The new run reserves its first account-carrying step (ledger.services.account_loads).
    apply_load_delta(run_load(again.status, new_steps))
    return again


def loop_retry_schedule(
    run: WorkflowRun,
    *,
    status: str,
    error: str | None,
    now: datetime,
    steps: list[WorkflowStepRun] | None = None,
) -> WorkflowRun | None:
    """A loop-level retry (docs/upstream.md §2.1, §2.2): the next attempt of a failed run, or None.

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
