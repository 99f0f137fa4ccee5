"""Loop-level retries (docs/upstream.md §2.1, §2.2): the next attempt of a failed or timed-out
run, as a new queued run of the same spec, loop and item, due after the backoff.

Two rules of upstream's later releases (docs/operations.md, "Retries within an admission"):

- **Try later.** A run whose decisive step (the last failed one) exited 75 (EX_TEMPFAIL) is
  run again later whether or not the loop has attempts left: a new queued run, due after
  the loop's retry backoff (TRY_LATER_DEFAULT_SECONDS when it has none), event
  `step_try_later`; the attempt is refunded (`run_attempt_failures` does not count it).
- **Re-dispatch bound.** Each automatic new run of an item (a loop retry, a try later; a
  lease recovery ends in a loop retry) is a re-dispatch, counted back to the item's last
  admission or operator retry (`redispatch_count`, ledger.admissions). One more than
  LOOPSWEB_MAX_REDISPATCH dead-letters the item instead (`dead_letter`, reason code
  `dead_lettered`). A re-dispatch after a rate limit (a step of the run put its account in
  cooldown: quota) is never counted, so quota never dead-letters an item.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q

from domain.retry import attempts_left, retry_backoff_seconds
from ledger.admissions import admission_created
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    AccountCooldown,
    LoopStatus,
    RunStatus,
    StepStatus,
    WorkflowEvent,
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
from ledger.services.notifications import notify_run_failed

# A run that ends with one of these may be retried by its loop (workItemStatusForLoopRun).
RETRYABLE_RUN_STATUSES = (RunStatus.FAILED, RunStatus.TIMED_OUT)

# EX_TEMPFAIL (sysexits.h): the step asks to be run again later.
TRY_LATER_EXIT_CODE = 75
# The wait before a try later when the loop has no retry backoff (--retry-backoff 0).
TRY_LATER_DEFAULT_SECONDS = 30
TRY_LATER_EVENT = "step_try_later"
TRY_LATER_REASON = (
    "the agent asked to try later (exit 75): step {step_id} runs again in {seconds} s"
)
DEAD_LETTERED_CODE = "dead_lettered"
DEAD_LETTERED_REASON = "re-dispatched {count} times: dead-lettered ({reason})"


def run_attempt_failures(run: WorkflowRun) -> int:
    """Failed or timed-out runs of this run's admission (same work item and loop); a run
    that asked to try later (event `step_try_later`) is refunded: not counted."""
    if not run.work_item_id or not run.loop_id:
        return 0
    tried_later = WorkflowEvent.objects.filter(
        workflow_run_id=OuterRef("pk"), event_type=TRY_LATER_EVENT
    )
    return (
        WorkflowRun.objects.filter(
            work_item_id=run.work_item_id,
            loop_id=run.loop_id,
            status__in=RETRYABLE_RUN_STATUSES,
        )
        .exclude(Exists(tried_later))
        .count()
    )


def try_later_step(steps: list[WorkflowStepRun]) -> WorkflowStepRun | None:
    """The run's decisive step (the last failed or timed-out one, by sequence) when it
    exited 75, else None."""
    ended = [
        step
        for step in steps
        if step.status in (StepStatus.FAILED, StepStatus.TIMED_OUT)
    ]
    decisive = max(ended, key=lambda step: step.sequence, default=None)
    if decisive is None or decisive.exit_code != TRY_LATER_EXIT_CODE:
        return None
    return decisive


def redispatch_count(item_id: str) -> int:
    """How many times the item was re-dispatched since its last admission or operator
    retry (ledger.admissions `admission_created`): its runs created by a loop retry or a
    try later (`retryOf`) since then; a loop's resume (`resumeOf`) is passed over, and a
    re-dispatch after a rate limit is not counted."""
    return sum(
        1
        for _, created in admission_created(item_id)
        if created.get("retryOf")
        and not created.get("resumeOf")
        and not created.get("rateLimited")
    )


def _steps_of(run: WorkflowRun) -> list[WorkflowStepRun]:
    return list(
        WorkflowStepRun.objects.filter(workflow_run_id=run.id).order_by("sequence")
    )


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
        steps = _steps_of(run)
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
    """A loop-level retry (docs/upstream.md §2.1, §2.2) or a try later: the next run of a
    failed run's item, or None.

    Only for a failed or timed-out run of an active loop whose item is still active and bound
    to this run, while the admission's failed attempts are fewer than `loop.max_attempts`,
    or whatever they are when the run's decisive step exited 75 (a try later, refunded):
    1. a new `queued` run of the same spec, loop, invocation and item, due after the backoff
       (`scheduled_for`; base `loop.retry_delay_ms`, doubled per failure, or per
       re-dispatch for a try later, capped by LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS; a try
       later without a base waits TRY_LATER_DEFAULT_SECONDS), with one `pending` step per
       step of the failed run on the same account (a cooling account is waited for, or
       moved off, at step start like any other);
    2. the item stays `admitted` (it never stops counting toward its caps), bound to the new
       run, `last_reason` = `attempt failed; retry pending: <error>` (a try later:
       TRY_LATER_REASON); attempts unchanged;
    3. events: `retry_scheduled` (a try later: `step_try_later`, naming the step) on the
       failed run, `created` (with attempt, retryOf and the re-dispatch count) on the new
       one; the new run goes to the run queue when this transaction commits.
    Past LOOPSWEB_MAX_REDISPATCH re-dispatches the item is dead-lettered instead (module
    docstring). The caller holds the admission lock and the run row.
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
    previous_steps = steps if steps is not None else _steps_of(run)
    later = try_later_step(previous_steps) if status == RunStatus.FAILED else None
    failures = run_attempt_failures(run) - (1 if later is not None else 0)  # refunded
    if later is None and not attempts_left(
        failures=failures, max_attempts=loop.max_attempts
    ):
        return None
    rate_limited = AccountCooldown.objects.filter(
        step_run_id__in=[step.id for step in previous_steps]
    ).exists()
    done = redispatch_count(item.id)
    if not rate_limited and done >= int(settings.LOOPSWEB_MAX_REDISPATCH):
        _dead_letter(run, item, count=done, error=error, now=now)
        return None
    return _run_later(
        run,
        item,
        later=later,
        failures=failures,
        redispatches=done + (0 if rate_limited else 1),
        rate_limited=rate_limited,
        error=error,
        now=now,
        steps=previous_steps,
    )


def _run_later(
    run: WorkflowRun,
    item: WorkflowWorkItem,
    *,
    later: WorkflowStepRun | None,
    failures: int,
    redispatches: int,
    rate_limited: bool,
    error: str | None,
    now: datetime,
    steps: list[WorkflowStepRun],
) -> WorkflowRun:
    """`loop_retry_schedule`'s new run, its events and the item bound to it (1. to 3.)."""
    loop = run.loop
    assert loop is not None
    base = loop.retry_delay_ms / 1000
    cap = float(settings.LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS)
    if later is None:
        delay = retry_backoff_seconds(base, failures, cap)
    elif base > 0:
        delay = retry_backoff_seconds(base, redispatches, cap)
    else:
        delay = float(TRY_LATER_DEFAULT_SECONDS)
    due = now + timedelta(seconds=delay)
    runs = WorkflowRun.objects.filter(work_item_id=item.id).count()
    retry = run_again(
        run,
        item_id=item.id,
        scheduled_for=due,
        idempotency_key=f"{item.id}:{item.attempts}:attempt{failures + 1}"
        if later is None
        else f"{item.id}:{item.attempts}:later{runs + 1}",
        steps=steps,
    )
    details: dict[str, Any] = {
        "attempt": failures + 1,
        "maxAttempts": loop.max_attempts,
        "notBefore": due.isoformat(),
        "rateLimited": rate_limited,
        "redispatch": redispatches,
        "maxRedispatch": int(settings.LOOPSWEB_MAX_REDISPATCH),
    }
    if later is not None:
        details.update(tryLater=True, exitCode=TRY_LATER_EXIT_CODE)
    append_event(
        retry.id,
        "created",
        payload={"workItemId": item.id, "retryOf": run.id, **details},
    )
    append_event(
        run.id,
        "retry_scheduled" if later is None else TRY_LATER_EVENT,
        step_id=None if later is None else later.step_id,
        payload={"retryRunId": retry.id, **details},
    )
    if later is not None:
        reason = TRY_LATER_REASON.format(step_id=later.step_id, seconds=round(delay))
    elif error:
        reason = RETRY_PENDING_REASON_WITH_ERROR.format(error=error)
    else:
        reason = RETRY_PENDING_REASON
    WorkflowWorkItem.objects.filter(pk=item.id).update(
        status=WorkItemStatus.ADMITTED,
        workflow_run_id=retry.id,
        lease_expires_at=None,
        last_reason=reason,
        updated_at=now,
    )
    enqueue_run_workflow(retry.id, not_before=due)
    return retry


def _dead_letter(
    run: WorkflowRun,
    item: WorkflowWorkItem,
    *,
    count: int,
    error: str | None,
    now: datetime,
) -> None:
    """The item re-dispatched `count` times already goes to `dead_letter` (reason code
    `dead_lettered`, the run's error in its reason) instead of running again; event
    `dead_lettered` on the run. An operator's requeue or retry admits it again."""
    reason = DEAD_LETTERED_REASON.format(
        count=count, reason=error or item.last_reason or run.status
    )
    WorkflowWorkItem.objects.filter(pk=item.id).update(
        status=WorkItemStatus.DEAD_LETTER,
        lease_expires_at=None,
        next_attempt_at=None,
        last_reason=reason,
        reason_code=DEAD_LETTERED_CODE,
        updated_at=now,
    )
    notify_run_failed(  # docs/operations.md "Notifications"
        item_id=item.id, run_id=run.id, status=run.status, error=reason
    )
    append_event(
        run.id,
        "dead_lettered",
        payload={
            "workItemId": item.id,
            "redispatches": count,
            "maxRedispatch": int(settings.LOOPSWEB_MAX_REDISPATCH),
            "reason": reason,
        },
    )
