"""The end of a run and its cascade: the run's open steps closed (and the account load
they held released), the run terminal with its event, a loop-level retry scheduled when the
loop allows one (ledger.services.retries), else its work item ended; a one-shot loop
stopped; a generated one-shot spec archived (docs/upstream.md §2.1, §2.3). The caller holds the
admission lock and the run row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Concat
from django.db.models.lookups import GreaterThan

from ledger.claims import COOLDOWN, PARKED_EVENT
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    TERMINAL_RUN_STATUSES,
    LoopStatus,
    RunStatus,
    SpecStatus,
    StepReasonCode,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.services.account_loads import apply_load_delta, load_change, run_load
from ledger.services.attempts import attempt_close
from ledger.services.common import (
    ARCHIVE_REASON,
    GENERATED_TEMPLATES_BY_ROUTE_KEY,
    OPEN_STEP_STATUSES,
    SUCCEEDED_ON_ATTEMPT_REASON,
    append_event,
    clean_text,
    to_ms,
)
from ledger.services.notifications import notify_run_failed
from ledger.services.retries import loop_retry_schedule


def task_parked(run_id: str) -> bool:
    """Whether the run parked its task for good: a second account's report of a failed
    login was refused (ledger.claims, event `task_parked`; one of a rate limit holds the
    task instead, and its run goes on)."""
    return (
        WorkflowEvent.objects.filter(workflow_run_id=run_id, event_type=PARKED_EVENT)
        .exclude(payload_json__kind=COOLDOWN)
        .exists()
    )


def finish_open_steps(
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
            # Ended with its run (recovery, the run's deadline): an other failure.
            failed = running_to in (StepStatus.FAILED, StepStatus.TIMED_OUT)
            step.reason_code = StepReasonCode.FAILED if failed else StepReasonCode.NONE
            attempt_close(step, now=now)
        else:
            # A step that never started gets no error of its own: the run's error explains it.
            step.status = pending_to
        step.save(
            update_fields=[
                "status",
                "finished_at",
                "duration_ms",
                "error",
                "reason_code",
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
    run: WorkflowRun,
    *,
    status: str,
    reason: str | None,
    now: datetime,
    succeeded: bool = False,
) -> int:
    """Bulk cascade to the run's work item (docs/upstream.md §2.1): only while it is active.

    `last_reason = COALESCE(new reason, old reason)`; the lease is cleared; bindings stay (the
    item keeps pointing at the run that decided it). A run that succeeded with no reason of
    its own after earlier runs of the item (a loop's retry, an operator's retry) gives the
    item `succeeded on attempt N`, numbered as the item page and the API number its runs
    (oldest first), so a failed attempt's `retry pending` reason never outlives the
    success; the item's first run keeps the old reason, as upstream. Counted inside the
    same UPDATE: no statement of its own.
    """
    if not run.work_item_id:
        return 0
    old_reason: Any = F("last_reason")
    if succeeded and reason is None:
        old_reason = _attempt_reason(run, old_reason)
    return WorkflowWorkItem.objects.filter(
        Q(workflow_run_id=run.id) | Q(workflow_run__isnull=True),
        pk=run.work_item_id,
        status__in=ACTIVE_WORK_ITEM_STATUSES,
    ).update(
        status=status,
        lease_expires_at=None,
        last_reason=Coalesce(Value(reason, output_field=TextField()), old_reason),
        updated_at=now,
    )


def _attempt_reason(run: WorkflowRun, otherwise: Any) -> Any:
    """`succeeded on attempt N` when `run` is the item's N-th run (N > 1), else `otherwise`."""
    runs = (
        WorkflowRun.objects.filter(work_item_id=OuterRef("pk"), id__lte=run.id)
        .order_by()
        .values("work_item_id")
        .annotate(n=Count("*"))
        .values("n")
    )
    attempt = Subquery(runs, output_field=IntegerField())
    head, tail = SUCCEEDED_ON_ATTEMPT_REASON.split("{attempt}")
    return Case(
        When(
            GreaterThan(attempt, 1),
            then=Concat(
                Value(head),
                Cast(attempt, TextField()),
                Value(tail),
                output_field=TextField(),
            ),
        ),
        default=otherwise,
        output_field=TextField(),
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
    """Archive a generated one-shot route spec once its run is terminal (docs/upstream.md §2.3).

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
    loop_input = found if isinstance(found := target.get("input"), dict) else {}
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
    # A failed or timed-out run with loop attempts left never gets here: `loop_retry_schedule`
    # already put its item back to `admitted` (workItemStatusForLoopRun).
    if status == RunStatus.SUCCEEDED:
        return WorkItemStatus.SUCCEEDED
    if status == RunStatus.CANCELLED:
        return WorkItemStatus.CANCELLED
    return WorkItemStatus.FAILED


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
    # A parked task (ledger.claims) waits for an operator: no loop retry.
    retry = (
        None
        if status == RunStatus.FAILED and task_parked(run.id)
        else loop_retry_schedule(
            run, status=status, error=run.error, now=now, steps=steps
        )
    )
    if retry is None:
        ended = _cascade_work_item(
            run,
            status=_work_item_status_for_run(status),
            reason=item_reason,
            now=now,
            succeeded=status == RunStatus.SUCCEEDED,
        )
        if ended and status in (RunStatus.FAILED, RunStatus.TIMED_OUT):
            # Its item failed for good (docs/operations.md "Notifications").
            notify_run_failed(
                item_id=run.work_item_id, run_id=run.id, status=status, error=run.error
            )
    _close_one_shot_loop(run, now)
    # Under the admission lock: an admission reusing this spec by name either committed its
    # run before us (we see it non-terminal and keep the spec) or runs after us (it sees the
    # spec archived and creates a new one). A scheduled retry keeps the spec (non-terminal).
    if archive:
        maybe_archive_spec(run, now)
    return retry


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
    was_running = finish_open_steps(
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
