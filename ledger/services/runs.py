"""Lifecycle writes of the ledger: runs, step runs, work items after admission, cooldowns.

Admission (routing.services) creates a `queued` run with `pending` step runs; everything after
that goes through here. Rules every service follows:

- Short `transaction.atomic()` blocks. On SQLite each one takes the database write lock at
  BEGIN (IMMEDIATE), so no transaction is ever held across a subprocess or a sleep; the runner
  calls one service per state change.
- Lock order, to keep PostgreSQL free of deadlocks: the admission lock (when taken) first,
  then the run row (`select_for_update(no_key=True)`), then its steps, work item, loop, spec.
  Every service that appends an event holds the run row lock, which is what makes the
  per-run `sequence = MAX + 1` safe on PostgreSQL (SQLite's write lock covers it already).
- Conditional updates (`filter(status=<expected>)`) for claims, so a second delivery or a
  racing recovery changes nothing.
- Messages of domain errors are the module constants below (upstream wording where upstream
  has one, reference §2).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q, TextField, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    TERMINAL_RUN_STATUSES,
    AccountCooldown,
    Loop,
    LoopStatus,
    RunStatus,
    SpecStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.ratelimit import cooldown_backoff
from routing.domain.errors import ApplicationError, ValidationError
from routing.domain.keys import GENERIC_EVENT, TODOS_TASK
from routing.domain.templates import (
    EVENT_WORKER_VERIFIER,
    TASK_LIFECYCLE,
    TODOS_TASK_WORKER_VERIFIER,
    step_account,
)
from routing.lock import admission_lock

logger = logging.getLogger(__name__)

# --- messages ---------------------------------------------------------------------------------

RUN_NOT_FOUND = "workflow run not found: {run_id}"
RUN_NOT_QUEUED = "workflow run is not queued: {run_id} status={status}"
RUN_ALREADY_TERMINAL = "workflow run is already terminal: {run_id} status={status}"
RUN_NOT_RETRYABLE = "workflow run is not retryable: {run_id} status={status}"
RUN_NOT_LATEST = "workflow run is not the latest run of work item {item_id}: {run_id}"
RUN_WITHOUT_WORK_ITEM = "workflow run has no work item: {run_id}"
RUN_STATUS_NOT_TERMINAL = "not a terminal workflow run status: {status}"
STEP_NOT_FOUND = "workflow step run not found: {step_run_id}"
STEP_NOT_CLAIMABLE = (
    "workflow step is not claimable: {run_id}/{step_id} status={status}"
)
STEP_NOT_RUNNING = "workflow step is not running: {run_id}/{step_id} status={status}"
STEP_STATUS_NOT_FINAL = "not a final workflow step status: {status}"
WORK_ITEM_NOT_FOUND = "workflow work item not found: {item_id}"
WORK_ITEM_NOT_REQUEUEABLE = (
    "workflow work item is not requeueable: {item_id} status={status}"
)
WORK_ITEM_NOT_CANCELLABLE = (
    "workflow work item is not cancellable: {item_id} status={status}"
)
WORK_ITEM_NOT_DEAD_LETTERABLE = (
    "workflow work item is not dead-letterable: {item_id} status={status}"
)
WORK_ITEM_NOT_RUNNABLE = "workflow work item is not runnable: {item_id} status={status}"
REQUEUE_REASON_REQUIRED = "routes requeue requires --reason <text>"
REASON_REQUIRED = "a reason is required"

# Reasons and errors written to rows (stable text operators search for).
LEASE_EXPIRED_STEP_ERROR = (
    "worker lease expired before completion (claimed_by={claimed_by})"
)
LEASE_EXPIRED_RUN_ERROR = (
    "workflow run lease expired before completion (claimed_by={claimed_by})"
)
LEASE_EXPIRED_ITEM_REASON = "parent loop run lease expired before completion"
ARCHIVE_REASON = "terminal generated one-shot route workflow"
CANCEL_REASON_DEFAULT = "cancelled by operator"
RUN_RETRY_REASON = "retry of workflow run {run_id}"
WAIT_COOLING = "account {profile} is cooling down until {until}"
WAIT_AT_CAPACITY = "account {profile} is at capacity ({running}/{limit} running steps)"

# Statuses (reference §2.1).
REQUEUEABLE_STATUSES = (
    WorkItemStatus.SUCCEEDED,
    WorkItemStatus.FAILED,
    WorkItemStatus.DEAD_LETTER,
    WorkItemStatus.CANCELLED,
)
RUNNABLE_STATUSES = (
    WorkItemStatus.ADMITTED,
    WorkItemStatus.QUEUED,
    WorkItemStatus.DEFERRED,
    WorkItemStatus.RUNNING,
)
CANCELLABLE_STATUSES = (
    WorkItemStatus.QUEUED,
    WorkItemStatus.DEFERRED,
    WorkItemStatus.ADMITTED,
    WorkItemStatus.RUNNING,
)
DEAD_LETTERABLE_STATUSES = (
    WorkItemStatus.QUEUED,
    WorkItemStatus.DEFERRED,
    WorkItemStatus.SUCCEEDED,
    WorkItemStatus.FAILED,
    WorkItemStatus.CANCELLED,
)
STEP_CLAIMABLE_STATUSES = (StepStatus.PENDING, StepStatus.FAILED, StepStatus.TIMED_OUT)
STEP_FINAL_STATUSES = (StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.TIMED_OUT)
OPEN_STEP_STATUSES = (StepStatus.PENDING, StepStatus.RUNNING)
# The generated templates of each route key: only their specs are archived automatically.
GENERATED_TEMPLATES_BY_ROUTE_KEY: dict[str, frozenset[str]] = {
    TODOS_TASK: frozenset({TODOS_TASK_WORKER_VERIFIER, TASK_LIFECYCLE}),
    GENERIC_EVENT: frozenset({EVENT_WORKER_VERIFIER}),
}


class LedgerError(ApplicationError):
    """A lifecycle change that the current state does not allow."""


class NotFound(LedgerError):
    pass


# --- helpers ----------------------------------------------------------------------------------


def worker_identity() -> str:
    """`<host>:<pid>` of this process: stored as `claimed_by`; recovery reads the host back."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def _lease() -> timedelta:
    return timedelta(seconds=float(settings.LOOPSWEB_RUN_LEASE_SECONDS))


def _ms(delta: timedelta) -> int:
    return max(0, int(delta.total_seconds() * 1000))


def _clean_text(value: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL; agent output sometimes does.
    return value.replace("\x00", "\ufffd") if value is not None else None


def _lock_run(run_id: str) -> WorkflowRun:
    try:
        return (
            # of=self: lock the run row only (the loop join is nullable, and the spec and loop
            # rows are not ours to lock here).
            WorkflowRun.objects.select_for_update(no_key=True, of=("self",))
            .select_related("workflow", "loop")
            .get(pk=run_id)
        )
    except WorkflowRun.DoesNotExist:
        raise NotFound(RUN_NOT_FOUND.format(run_id=run_id)) from None


def _lock_step(step_run_id: str) -> tuple[WorkflowRun, WorkflowStepRun]:
    """Lock a step's run row (as `_lock_run`), then the step row itself."""
    try:
        step = WorkflowStepRun.objects.only("id", "workflow_run_id").get(pk=step_run_id)
    except WorkflowStepRun.DoesNotExist:
        raise NotFound(STEP_NOT_FOUND.format(step_run_id=step_run_id)) from None
    run = _lock_run(step.workflow_run_id)
    return run, WorkflowStepRun.objects.select_for_update(no_key=True).get(
        pk=step_run_id
    )


def _append_event(
    run_id: str,
    event_type: str,
    *,
    step_id: str | None = None,
    payload: dict[str, Any] | None = None,
) -> WorkflowEvent:
    # The caller holds the run row lock (or SQLite's write lock): MAX+1 cannot race.
    last = WorkflowEvent.objects.filter(workflow_run_id=run_id).aggregate(
        m=Max("sequence")
    )["m"]
    return WorkflowEvent.objects.create(
        workflow_run_id=run_id,
        sequence=(last or 0) + 1,
        event_type=event_type,
        step_id=step_id,
        payload_json=payload,
    )


def steps_from_spec(steps_json: Any) -> list[dict[str, Any]]:
    """The step dicts of a spec's `steps_json` (a list; older rows may wrap it in a dict)."""
    if isinstance(steps_json, dict):
        steps_json = steps_json.get("steps")
    if not isinstance(steps_json, list):
        return []
    return [step for step in steps_json if isinstance(step, dict)]


def step_spec(run: WorkflowRun, step_id: str) -> dict[str, Any]:
    for step in steps_from_spec(run.workflow.steps_json):
        if step.get("id") == step_id:
            return step
    return {}


def _max_per_profile(step: dict[str, Any]) -> int | None:
    routing = step.get("routing")
    if not isinstance(routing, dict):
        target = step.get("target")
        routing = target.get("routing") if isinstance(target, dict) else None
    value = routing.get("maxPerProfile") if isinstance(routing, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _finish_open_steps(
    run: WorkflowRun,
    *,
    pending_to: str,
    running_to: str,
    error: str | None,
    now: datetime,
) -> list[WorkflowStepRun]:
    """Close the run's pending and running steps; returns the steps that were running."""
    was_running: list[WorkflowStepRun] = []
    steps = WorkflowStepRun.objects.filter(
        workflow_run_id=run.id, status__in=OPEN_STEP_STATUSES
    ).order_by("sequence")
    for step in steps:
        if step.status == StepStatus.RUNNING:
            was_running.append(step)
            step.status = running_to
            step.finished_at = now
            step.duration_ms = _ms(now - step.started_at) if step.started_at else None
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
        _append_event(
            run.id,
            f"step_{step.status}",
            step_id=step.step_id,
            payload={"error": step.error} if step.error else None,
        )
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
    if (
        WorkflowRun.objects.filter(loop_id=loop.id)
        .exclude(status__in=TERMINAL_RUN_STATUSES)
        .exclude(pk=run.id)
        .exists()
    ):
        return
    type(loop).objects.filter(pk=loop.id, status=LoopStatus.ACTIVE).update(
        status=LoopStatus.STOPPED, next_run_at=None, updated_at=now
    )


def _maybe_archive_spec(run: WorkflowRun, now: datetime) -> bool:
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
    if (
        WorkflowRun.objects.filter(workflow_id=spec.id)
        .exclude(status__in=TERMINAL_RUN_STATUSES)
        .exists()
    ):
        return False
    type(spec).objects.filter(pk=spec.id, status=SpecStatus.ACTIVE).update(
        status=SpecStatus.ARCHIVED, updated_at=now
    )
    spec.status = SpecStatus.ARCHIVED
    _append_event(
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
    # One-shot route loops have max_attempts 1, so a failed or timed-out run never leaves a
    # loop retry pending: the item fails (workItemStatusForLoopRun with attempt 1 of 1).
    if status == RunStatus.SUCCEEDED:
        return WorkItemStatus.SUCCEEDED
    if status == RunStatus.CANCELLED:
        return WorkItemStatus.CANCELLED
    return WorkItemStatus.FAILED


def _end_run(
    run: WorkflowRun,
    *,
    status: str,
    error: str | None,
    item_reason: str | None,
    now: datetime,
    event_payload: dict[str, Any] | None = None,
) -> None:
    """Set the run terminal and cascade. The caller holds the admission lock and the run row."""
    run.status = status
    run.finished_at = now
    run.duration_ms = _ms(now - run.started_at) if run.started_at else None
    run.error = _clean_text(error)
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
    _append_event(run.id, status, payload=payload or None)
    _cascade_work_item(
        run, status=_work_item_status_for_run(status), reason=item_reason, now=now
    )
    _close_one_shot_loop(run, now)
    # Under the admission lock: an admission reusing this spec by name either committed its
    # run before us (we see it non-terminal and keep the spec) or runs after us (it sees the
    # spec archived and creates a new one).
    _maybe_archive_spec(run, now)


# --- process groups left behind ---------------------------------------------------------------


def _process_start_time(pid: int) -> datetime | None:
    """When `pid` started (Linux /proc), to tell a step's process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
    seconds = boot + ticks / os.sysconf("SC_CLK_TCK")
    return datetime.fromtimestamp(seconds, tz=UTC)


def kill_step_process_group(
    step: WorkflowStepRun, *, claimed_by: str | None, grace_seconds: float = 1.0
) -> bool:
    """Kill a step's process group if it still lives on this host. True when signalled.

    Only the claiming host can see the process. The pid is trusted only when it still leads
    its own group (the runner starts every step in a new session) and started no earlier
    than the step did, so a reused pid is never killed.
    """
    pid = step.pid
    if not pid or not claimed_by or not step.started_at:
        return False
    if claimed_by.rsplit(":", 1)[0] != socket.gethostname():
        return False
    try:
        if os.getpgid(pid) != pid:
            return False
    except ProcessLookupError:
        return False
    started = _process_start_time(pid)
    # /proc's boot time has one-second resolution: allow two seconds of slack.
    if started is None or started < step.started_at - timedelta(seconds=2):
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def _kill_leftovers(
    steps: Iterable[WorkflowStepRun], claimed_by: str | None
) -> list[int]:
    grace = float(settings.LOOPSWEB_KILL_GRACE_SECONDS)
    return [
        step.pid
        for step in steps
        if step.pid
        and kill_step_process_group(step, claimed_by=claimed_by, grace_seconds=grace)
    ]


# --- runs -------------------------------------------------------------------------------------


def run_claim(
    *, run_id: str, worker: str, now: datetime | None = None
) -> WorkflowRun | None:
    """Claim a `queued` run for `worker`; None when it is not queued (a second delivery).

    1. Conditional UPDATE queued → running: exactly one row, or nothing happens.
    2. The run gets started_at, claimed_by and a lease (LOOPSWEB_RUN_LEASE_SECONDS).
    3. Its work item goes `running` (reference §2.1: from admitted/queued/deferred/running)
       with workflow_run bound and lease_expires_at = now + the loop's lease_ms (upstream).
       An item no longer runnable (an operator ended it) cancels the run instead, with
       upstream's `workflow work item is not runnable` message, and None is returned.
    4. Event `claimed` (loopsweb: upstream runs are created running).
    """
    now = _now(now)
    with transaction.atomic():
        # The admission lock first (lock order; the item becomes `running`). The UPDATE below
        # is the compare-and-set: whoever changes the row owns the run.
        admission_lock()
        claimed = WorkflowRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING,
            started_at=now,
            claimed_by=worker,
            lease_expires_at=now + _lease(),
            updated_at=now,
        )
        if claimed != 1:
            return None
        run = _lock_run(run_id)
        item = (
            WorkflowWorkItem.objects.filter(pk=run.work_item_id).first()
            if run.work_item_id
            else None
        )
        if item is not None and item.status not in RUNNABLE_STATUSES:
            message = WORK_ITEM_NOT_RUNNABLE.format(item_id=item.id, status=item.status)
            _finish_open_steps(
                run,
                pending_to=StepStatus.CANCELLED,
                running_to=StepStatus.CANCELLED,
                error=None,
                now=now,
            )
            _end_run(
                run,
                status=RunStatus.CANCELLED,
                error=message,
                item_reason=None,
                now=now,
            )
            return None
        if item is not None:
            lease_ms = run.loop.lease_ms if run.loop else None
            item_lease = (
                now + timedelta(milliseconds=lease_ms)
                if lease_ms
                else run.lease_expires_at
            )
            WorkflowWorkItem.objects.filter(pk=item.id).update(
                status=WorkItemStatus.RUNNING,
                workflow_run_id=run.id,
                lease_expires_at=item_lease,
                updated_at=now,
            )
        _append_event(
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


def run_lease_renew(*, run_id: str, worker: str, now: datetime | None = None) -> bool:
    """Extend a running run's lease; False when the run is no longer this worker's.

    False means it was cancelled, finalized or recovered meanwhile: the runner must stop its
    process and write nothing more for the run. A single conditional UPDATE, so it is cheap
    enough to run every third of a lease.
    """
    now = _now(now)
    with transaction.atomic():
        renewed = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by=worker
        ).update(lease_expires_at=now + _lease(), updated_at=now)
    return renewed == 1


@dataclass(frozen=True)
class StepStart:
    """The outcome of `step_start`: started, or refused with why and when to look again."""

    started: bool
    step_run: WorkflowStepRun
    wait_reason: str | None = None
    wait_code: str | None = None
    retry_at: datetime | None = None


def step_start(
    *, step_run_id: str, worker: str, now: datetime | None = None
) -> StepStart:
    """Move a step run to `running`, unless its account is full or cooling.

    1. Takes the admission lock first (DESIGN rule 2): the account check and the start are
       one decision, serialised with admissions and every other step start.
    2. The run must be `running` and claimed by `worker`; the step must be pending (or
       failed/timed_out, upstream's retry states). Otherwise `STEP_NOT_CLAIMABLE`.
    3. Account re-check, when the step has an account_profile: cooling now → refused
       (`retry_at` = when it frees); the step's `routing.maxPerProfile` set and running steps
       on the account (other than this one) >= it → refused. A refusal records one
       `step_waiting` event per distinct reason and renews the lease; the runner retries.
    4. Started: started_at = now, finish fields and output cleared, event `step_started`
       with the account, run lease renewed.
    """
    now = _now(now)
    with transaction.atomic():
        admission_lock()
        run, step = _lock_step(step_run_id)
        if (
            run.status != RunStatus.RUNNING
            or run.claimed_by != worker
            or step.status not in STEP_CLAIMABLE_STATUSES
        ):
            raise LedgerError(
                STEP_NOT_CLAIMABLE.format(
                    run_id=run.id,
                    step_id=step.step_id,
                    status=step.status
                    if run.status == RunStatus.RUNNING
                    else f"{step.status} (run {run.status})",
                )
            )
        run.lease_expires_at = now + _lease()
        WorkflowRun.objects.filter(pk=run.id).update(
            lease_expires_at=run.lease_expires_at, updated_at=now
        )
        refusal = _account_refusal(step, step_spec(run, step.step_id), now)
        if refusal is not None:
            code, reason, retry_at = refusal
            last = (
                WorkflowEvent.objects.filter(workflow_run_id=run.id)
                .order_by("-sequence")
                .first()
            )
            if not (
                last
                and last.event_type == "step_waiting"
                and last.step_id == step.step_id
                and (last.payload_json or {}).get("code") == code
            ):
                _append_event(
                    run.id,
                    "step_waiting",
                    step_id=step.step_id,
                    payload={"code": code, "reason": reason},
                )
            return StepStart(
                started=False,
                step_run=step,
                wait_reason=reason,
                wait_code=code,
                retry_at=retry_at,
            )
        step.status = StepStatus.RUNNING
        step.started_at = now
        step.finished_at = None
        step.exit_code = None
        step.pid = None
        step.duration_ms = None
        step.stdout = None
        step.stderr = None
        step.error = None
        step.save()
        _append_event(
            run.id,
            "step_started",
            step_id=step.step_id,
            payload={
                "accountProfile": step.account_profile,
                "accountTool": step.account_tool,
            },
        )
    return StepStart(started=True, step_run=step)


def _account_refusal(
    step: WorkflowStepRun, spec: dict[str, Any], now: datetime
) -> tuple[str, str, datetime | None] | None:
    profile = step.account_profile
    if not profile:
        return None
    cooldown = AccountCooldown.objects.filter(
        account_profile=profile, until__gt=now
    ).first()
    if cooldown is not None:
        return (
            "cooldown",
            WAIT_COOLING.format(profile=profile, until=cooldown.until.isoformat()),
            cooldown.until,
        )
    limit = _max_per_profile(spec)
    if limit is None:
        return None
    running = (
        WorkflowStepRun.objects.filter(
            status=StepStatus.RUNNING, account_profile=profile
        )
        .exclude(pk=step.pk)
        .count()
    )
    if running >= limit:
        return (
            "profile_cap",
            WAIT_AT_CAPACITY.format(profile=profile, running=running, limit=limit),
            None,
        )
    return None


def step_process_record(*, step_run_id: str, pid: int) -> None:
    """Record the pid of a running step's process (its process group id too)."""
    with transaction.atomic():
        WorkflowStepRun.objects.filter(
            pk=step_run_id, status=StepStatus.RUNNING
        ).update(pid=pid, updated_at=timezone.now())


def step_finish(
    *,
    step_run_id: str,
    status: str,
    exit_code: int | None = None,
    pid: int | None = None,
    duration_ms: int | None = None,
    stdout: str | None = None,
    stderr: str | None = None,
    error: str | None = None,
    now: datetime | None = None,
) -> WorkflowStepRun:
    """Finish a running step: succeeded, failed or timed_out (reference §2.3).

    Only from `running` (else `STEP_NOT_RUNNING`, e.g. after recovery or cancel took the
    run). Records the exit code, pid, duration, output tails and error; event
    `step_<status>`. The pid is kept as a record (upstream clears it); recovery only looks
    at running steps, so a finished step's pid is never signalled.
    """
    if status not in STEP_FINAL_STATUSES:
        raise LedgerError(STEP_STATUS_NOT_FINAL.format(status=status))
    now = _now(now)
    with transaction.atomic():
        run, step = _lock_step(step_run_id)
        if step.status != StepStatus.RUNNING or run.status != RunStatus.RUNNING:
            raise LedgerError(
                STEP_NOT_RUNNING.format(
                    run_id=run.id, step_id=step.step_id, status=step.status
                )
            )
        step.status = status
        step.finished_at = now
        step.exit_code = exit_code
        step.pid = pid if pid is not None else step.pid
        step.duration_ms = (
            duration_ms
            if duration_ms is not None
            else (_ms(now - step.started_at) if step.started_at else None)
        )
        step.stdout = _clean_text(stdout)
        step.stderr = _clean_text(stderr)
        step.error = _clean_text(error)
        step.save()
        _append_event(
            run.id,
            f"step_{status}",
            step_id=step.step_id,
            payload={
                "exitCode": exit_code,
                "durationMs": step.duration_ms,
                **({"error": step.error} if step.error else {}),
            },
        )
    return step


def step_skip(
    *, step_run_id: str, reason: str | None = None, now: datetime | None = None
) -> WorkflowStepRun:
    """Skip a pending (or running) step, e.g. after an earlier step failed; event `step_skipped`."""
    now = _now(now)
    with transaction.atomic():
        run, step = _lock_step(step_run_id)
        if step.status not in OPEN_STEP_STATUSES or run.status != RunStatus.RUNNING:
            raise LedgerError(
                STEP_NOT_CLAIMABLE.format(
                    run_id=run.id, step_id=step.step_id, status=step.status
                )
            )
        step.status = StepStatus.SKIPPED
        step.error = _clean_text(reason)
        step.save(update_fields=["status", "error", "updated_at"])
        _append_event(
            run.id,
            "step_skipped",
            step_id=step.step_id,
            payload={"reason": reason} if reason else None,
        )
    return step


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
    now = _now(now)
    with transaction.atomic():
        admission_lock()
        run = _lock_run(run_id)
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
        _end_run(run, status=status, error=error, item_reason=error, now=now)
    return run


def run_cancel(
    *, run_id: str, reason: str = CANCEL_REASON_DEFAULT, now: datetime | None = None
) -> WorkflowRun:
    """Cancel a queued or running run (reference §2.3 run cancel).

    Pending/running steps → cancelled, run → cancelled (error = reason), its active work item
    → cancelled with the reason, loop and spec as in `run_finalize`. The runner notices at its
    next lease renewal and kills its process group; if the step's process group is still
    alive on this host it is killed here too (the runner may be gone).
    """
    if not reason or not reason.strip():
        raise ValidationError(REASON_REQUIRED)
    now = _now(now)
    with transaction.atomic():
        admission_lock()
        run = _lock_run(run_id)
        if run.status in TERMINAL_RUN_STATUSES:
            raise LedgerError(
                RUN_ALREADY_TERMINAL.format(run_id=run.id, status=run.status)
            )
        was_running = _finish_open_steps(
            run,
            pending_to=StepStatus.CANCELLED,
            running_to=StepStatus.CANCELLED,
            error=reason,
            now=now,
        )
        _end_run(
            run,
            status=RunStatus.CANCELLED,
            error=reason,
            item_reason=reason,
            now=now,
            event_payload={"reason": reason},
        )
    # After commit: signal processes only once the ledger says the run is over.
    _kill_leftovers(was_running, run.claimed_by)
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
    now = _now(now)
    expired = list(
        WorkflowRun.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now)
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
        run = _lock_run(run_id)
        if (
            run.status != RunStatus.RUNNING
            or run.lease_expires_at is None
            or run.lease_expires_at >= now
        ):
            return None  # renewed or finished since the scan
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
        _end_run(
            run,
            status=RunStatus.FAILED,
            error=LEASE_EXPIRED_RUN_ERROR.format(claimed_by=claimed_by),
            item_reason=LEASE_EXPIRED_ITEM_REASON,
            now=now,
            event_payload={"recovery": "lease_expired", "claimedBy": claimed_by},
        )
    killed = _kill_leftovers(was_running, claimed_by)
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


def run_retry(
    *, run_id: str, reason: str | None = None, now: datetime | None = None
) -> WorkflowWorkItem:
    """Requeue the work item of a failed, timed-out or cancelled run for re-admission.

    The run must be the item's latest run (the one the item is bound to); the item is then
    requeued exactly as `work_item_requeue` does (attempts kept), with `reason` or
    `retry of workflow run <id>`. The next drain admits it again as a new run.
    """
    run = WorkflowRun.objects.filter(pk=run_id).first()
    if run is None:
        raise NotFound(RUN_NOT_FOUND.format(run_id=run_id))
    if run.status not in (RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED):
        raise LedgerError(RUN_NOT_RETRYABLE.format(run_id=run.id, status=run.status))
    if not run.work_item_id:
        raise LedgerError(RUN_WITHOUT_WORK_ITEM.format(run_id=run.id))
    return work_item_requeue(
        item_id=run.work_item_id,
        reason=reason or RUN_RETRY_REASON.format(run_id=run.id),
        expected_run_id=run.id,
        now=now,
    )


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
    now: datetime | None = None,
) -> WorkflowWorkItem:
    """Operator requeue (upstream `routes requeue`, 0.4.12 semantics, reference §2.1).

    1. `reason` is mandatory (`routes requeue requires --reason <text>`).
    2. Only from succeeded/failed/dead_letter/cancelled (else
       `workflow work item is not requeueable: <id> status=<status>`; unknown id →
       `workflow work item not found: <id>`).
    3. → `queued`; workflow, loop, workflow_run, lease and next_attempt_at cleared;
       `last_reason` = the reason; attempts kept (the next admission makes them N+1).
    4. Inbox events that produced the item are reopened (`pending`), so the next drain
       routes it again: requeue means "admit this again", and the inbox is how loopsweb
       re-delivers.
    """
    if not reason or not reason.strip():
        raise ValidationError(REQUEUE_REASON_REQUIRED)
    now = _now(now)
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
        item.status = WorkItemStatus.QUEUED
        item.workflow = None
        item.loop = None
        item.workflow_run = None
        item.lease_expires_at = None
        item.next_attempt_at = None
        item.last_reason = reason.strip()
        item.reason_code = None
        item.save()
        _reopen_inbox_events(item, now)
    return item


def _reopen_inbox_events(item: WorkflowWorkItem, now: datetime) -> None:
    # Imported here: routing depends on the ledger, not the other way round at import time.
    from routing.models import InboxEvent, InboxState

    InboxEvent.objects.filter(work_item_id=item.id).exclude(
        state=InboxState.PENDING
    ).update(
        state=InboxState.PENDING,
        reason_code=None,
        last_reason=item.last_reason,
        updated_at=now,
    )


def work_item_cancel(
    *, item_id: str, reason: str, now: datetime | None = None
) -> WorkflowWorkItem:
    """Cancel a work item that is queued, deferred, admitted or running.

    A bound run that is not terminal is cancelled with it (`run_cancel`, which also cancels
    the item). Otherwise the item alone → `cancelled` with the reason and its lease cleared.
    Terminal items → `workflow work item is not cancellable: <id> status=<status>`.
    """
    if not reason or not reason.strip():
        raise ValidationError(REASON_REQUIRED)
    now = _now(now)
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
            run_cancel(run_id=open_run, reason=reason.strip(), now=now)
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
    *, item_id: str, reason: str, now: datetime | None = None
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
        item.status = WorkItemStatus.DEAD_LETTER
        item.next_attempt_at = None
        item.lease_expires_at = None
        item.last_reason = reason.strip()
        item.save()
    return item


# --- account cooldowns ------------------------------------------------------------------------


def account_cooldown_record(
    *,
    profile: str,
    tool: str | None,
    until: datetime | None,
    reason: str,
    step_run: WorkflowStepRun | None = None,
    now: datetime | None = None,
) -> AccountCooldown:
    """Record that `profile` reported a provider rate limit; it cools until the deadline.

    1. One row per account profile (upsert), under the admission lock: cooling changes what
       admission and step starts decide, so it is serialised with them.
    2. `reports` counts the reports of the current episode: +1 while the account is cooling
       or freed less than LOOPSWEB_COOLDOWN_CAP_SECONDS ago, else it starts again at 1 (so
       yesterday's limits do not lengthen today's backoff).
    3. Deadline: `until` when the provider named one, else exponential backoff
       (base × 2^(reports−1), capped). The row keeps the LATEST deadline of all overlapping
       reports; reason, tool and step follow the report that set the kept deadline.
    """
    now = _now(now)
    cap = float(settings.LOOPSWEB_COOLDOWN_CAP_SECONDS)
    with transaction.atomic():
        admission_lock()
        row = (
            AccountCooldown.objects.select_for_update(no_key=True)
            .filter(pk=profile)
            .first()
        )
        in_episode = row is not None and row.until > now - timedelta(seconds=cap)
        reports = row.reports + 1 if row is not None and in_episode else 1
        deadline = until
        if deadline is None:
            deadline = now + cooldown_backoff(
                reports=reports,
                base_seconds=float(settings.LOOPSWEB_COOLDOWN_BASE_SECONDS),
                cap_seconds=cap,
            )
        if row is None:
            row = AccountCooldown(account_profile=profile)
        if row.until is None or not in_episode or deadline >= row.until:
            row.until = deadline
            row.reason = _clean_text(reason)
            row.account_tool = tool
            row.step_run = step_run
        row.reports = reports
        row.save()
    return row


def runs_queued_stale(
    *, older_than: timedelta, now: datetime | None = None
) -> list[str]:
    """Queued runs untouched for `older_than` (their django-q2 task was lost): ids to enqueue again.

    Each returned run's updated_at is bumped, so a run is handed out again at most once per
    window however often this is called; the runner's conditional claim makes any duplicate
    delivery a no-op.
    """
    now = now or timezone.now()
    with transaction.atomic():
        ids = list(
            WorkflowRun.objects.filter(
                status=RunStatus.QUEUED, updated_at__lt=now - older_than
            )
            .order_by("created_at")
            .values_list("id", flat=True)[:500]
        )
        WorkflowRun.objects.filter(id__in=ids, status=RunStatus.QUEUED).update(
            updated_at=now
        )
    return ids


ONE_SHOT_LOOP_LEASE_MS = 5_400_000


def join_reason(old: str | None, new: str | None) -> str | None:
    """Upstream's reason trail: `old; new` when both are set, else whichever is."""
    if old and new:
        return f"{old}; {new}"
    return new or old


def work_item_admit(
    *,
    item: WorkflowWorkItem,
    spec: WorkflowSpec,
    invocation: WorkflowInvocation,
    loop_name: str,
    loop_description: str,
    reason: str,
    now: datetime,
) -> tuple[Loop, WorkflowRun]:
    """Admit a queued/deferred item onto `spec` (reference §2.1, §3.6 steps 10-11).

    Call inside the admission transaction, after `admission_lock()`:
    1. a one-shot loop (`once` schedule, max 1 attempt, 90-minute lease) targeting the spec;
    2. the item becomes `admitted`: attempts + 1, bound to spec and loop, reason appended;
    3. a `queued` run with one `pending` step run per step, each carrying the account it will
       use (account_profile / account_tool, §2.3), and its `created` event; the item is bound
       to the run so the runner finds it.
    """
    loop = Loop.objects.create(
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
        max_attempts=1,
        retry_delay_ms=60_000,
        lease_ms=ONE_SHOT_LOOP_LEASE_MS,
    )
    item.attempts += 1
    item.status = WorkItemStatus.ADMITTED
    item.workflow, item.loop = spec, loop
    item.next_attempt_at = item.lease_expires_at = None
    item.last_reason = join_reason(item.last_reason, reason)
    item.reason_code = None
    run = WorkflowRun.objects.create(
        workflow=spec,
        workflow_name=spec.name,
        loop=loop,
        invocation=invocation,
        work_item=item,
        idempotency_key=f"{item.id}:{item.attempts}",
        status=RunStatus.QUEUED,
    )
    WorkflowStepRun.objects.bulk_create(
        [
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
    )
    WorkflowEvent.objects.create(
        workflow_run=run,
        sequence=1,
        event_type="created",
        payload_json={"workItemId": item.id},
    )
    item.workflow_run = run
    item.save()
    return loop, run
