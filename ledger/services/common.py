"""What every lifecycle service shares: messages (upstream wording where upstream has
one, docs/upstream.md §2), status sets, errors, row locks in the documented order, event append.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Subquery
from django.utils import timezone

from domain.errors import ApplicationError
from domain.keys import GENERIC_EVENT, TODOS_TASK
from domain.templates import (
    EVENT_WORKER_VERIFIER,
    TASK_LIFECYCLE,
    TODOS_TASK_WORKER_VERIFIER,
)
from ledger.ids import new_id
from ledger.instances import WorkerId, process_register
from ledger.models import (
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
    WorkItemStatus,
)

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
WORK_ITEM_NOT_CLAIMABLE = (
    "workflow work item is not claimable: {item_id} status={status}"
)
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
ITEM_RETRY_REASON = "retried by operator"
# Loop-level retry pending (docs/upstream.md §2.1, upstream wording).
RETRY_PENDING_REASON = "attempt failed; retry pending"
RETRY_PENDING_REASON_WITH_ERROR = "attempt failed; retry pending: {error}"
# A run that succeeds after earlier runs of its item (a retry): its item's reason, in place
# of the retry pending one (docs/operations.md, "Retries within an admission").
SUCCEEDED_ON_ATTEMPT_REASON = "succeeded on attempt {attempt}"
WAIT_COOLING = "account {profile} is cooling down until {until}"
WAIT_AT_CAPACITY = "account {profile} is at capacity ({running}/{limit} running steps)"
WAIT_POOL_RATE_LIMITED = "every account of the pool is rate limited until {until}"
POOL_WAIT_OVER = (
    "every account of the pool was rate limited for {seconds} s "
    "(LOOPSWEB_POOL_WAIT_SECONDS); the last: {reason}"
)

# Statuses (docs/upstream.md §2.1).
REQUEUEABLE_STATUSES = (
    WorkItemStatus.SUCCEEDED,
    WorkItemStatus.FAILED,
    WorkItemStatus.DEAD_LETTER,
    WorkItemStatus.CANCELLED,
    # loopsweb: the human it waited for decides to run it again (docs/revisions.md §4)
    WorkItemStatus.NEEDS_HUMAN,
)
RUNNABLE_STATUSES = (
    WorkItemStatus.ADMITTED,
    WorkItemStatus.QUEUED,
    WorkItemStatus.DEFERRED,
    WorkItemStatus.RUNNING,
)
# Admission (admitWorkflowWorkItem) claims only these (docs/upstream.md §2.1).
CLAIMABLE_STATUSES = (WorkItemStatus.QUEUED, WorkItemStatus.DEFERRED)
CANCELLABLE_STATUSES = (
    WorkItemStatus.QUEUED,
    WorkItemStatus.DEFERRED,
    WorkItemStatus.ADMITTED,
    WorkItemStatus.RUNNING,
    # loopsweb: the human it waited for drops it (docs/revisions.md §4)
    WorkItemStatus.NEEDS_HUMAN,
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
    """This process as a worker (`WorkerId`: `<host>:<pid>@<instance>`), stored as
    `claimed_by`; a process outside any run cluster records its instance once
    (ledger.instances.process_register; tried again next time if the database is away)."""
    try:
        process_register(timezone.now())
    except DatabaseError:
        pass  # its steps are then signalled by itself only (its lease renewal)
    return str(WorkerId.here())


def worker_host(worker: str) -> str:
    """The host of a worker identity (the identity itself when it is not one)."""
    parsed = WorkerId.parse(worker)
    return parsed.host if parsed is not None else worker


def now_or_default(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def lease_duration() -> timedelta:
    return timedelta(seconds=float(settings.LOOPSWEB_RUN_LEASE_SECONDS))


def to_ms(delta: timedelta) -> int:
    return max(0, int(delta.total_seconds() * 1000))


def clean_text(value: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL; agent output sometimes does.
    return value.replace("\x00", "\ufffd") if value is not None else None


def lock_run(run_id: str) -> WorkflowRun:
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


def lock_step(
    step_run_id: str, *, with_item: bool = False
) -> tuple[WorkflowRun, WorkflowStepRun, list[WorkflowStepRun]]:
    """Lock a step's run row (as `lock_run`), then the run's step rows (a handful, in
    sequence order): the step itself and its run's steps, which say what load the run puts
    on its accounts before and after the change (ledger.services.account_loads).

    `with_item`: the run's work item and its invocation come in the same statement (read,
    not locked), for a transaction that ends the run (`maybe_archive_spec` reads them). The
    run's own invocation always does: a step start reads its pool routing
    (ledger.services.failover.run_pool)."""
    related = ("work_item__invocation",) if with_item else ()
    try:
        # The run row found through the step and locked in one statement (as `lock_run`).
        run = (
            WorkflowRun.objects.select_for_update(no_key=True, of=("self",))
            .select_related("workflow", "loop", "invocation", *related)
            .get(
                pk=Subquery(
                    WorkflowStepRun.objects.filter(pk=step_run_id).values(
                        "workflow_run_id"
                    )[:1]
                )
            )
        )
    except WorkflowRun.DoesNotExist:
        raise NotFound(STEP_NOT_FOUND.format(step_run_id=step_run_id)) from None
    steps = list(
        WorkflowStepRun.objects.select_for_update(no_key=True)
        .filter(workflow_run_id=run.id)
        .order_by("sequence")
    )
    for candidate in steps:
        if candidate.pk == step_run_id:
            return run, candidate, steps
    raise NotFound(STEP_NOT_FOUND.format(step_run_id=step_run_id))


_EVENTS = WorkflowEvent._meta.db_table
# One row per event: the run's next sequence is its MAX + the event's place among the run's
# events of this statement. Both databases evaluate the SELECT before inserting any row.
_EVENT_ROW_SQL = (
    "SELECT %s, %s, COALESCE(MAX(sequence), 0) + %s, %s, %s, {payload}, %s "
    f'FROM "{_EVENTS}" WHERE workflow_run_id = %s'
)
_APPEND_EVENTS_SQL = (
    f'INSERT INTO "{_EVENTS}" '
    "(id, workflow_run_id, sequence, event_type, step_id, payload_json, created_at) "
)

# (run_id, event_type, step_id, payload) waiting for the end of `events_in_one_statement`.
_pending_events: ContextVar[list[tuple[str, str, str | None, Any]] | None] = ContextVar(
    "loopsweb_pending_events", default=None
)


def _write_events(events: list[tuple[str, str, str | None, Any]]) -> None:
    if not events:
        return
    fields = {f.name: f for f in WorkflowEvent._meta.fields}
    created = fields["created_at"].get_db_prep_save(timezone.now(), connection)
    # PostgreSQL types a UNION column from its branches: a NULL payload first would make
    # the column text, which jsonb rows cannot join.
    row = _EVENT_ROW_SQL.format(
        payload="CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    )
    place: dict[str, int] = {}
    rows: list[str] = []
    params: list[Any] = []
    for run_id, event_type, step_id, payload in events:
        place[run_id] = place.get(run_id, 0) + 1
        rows.append(row)
        params += [
            new_id(),
            run_id,
            place[run_id],
            event_type,
            step_id,
            fields["payload_json"].get_db_prep_save(payload, connection),
            created,
            run_id,
        ]
    with connection.cursor() as cursor:
        cursor.execute(_APPEND_EVENTS_SQL + " UNION ALL ".join(rows), params)


@contextmanager
def events_in_one_statement() -> Iterator[None]:
    """Hold the events `append_event` appends inside the block and write them, in order,
    with one INSERT when it ends (inside the caller's transaction; nothing on an error).

    For transactions that append several events (a step finishing and the next starting,
    a run ending): one statement instead of one per event.
    """
    if _pending_events.get() is not None:  # nested: the outer block writes them
        yield
        return
    token = _pending_events.set([])
    try:
        yield
        events = _pending_events.get() or []
    finally:
        _pending_events.reset(token)
    _write_events(events)


def append_event(
    run_id: str,
    event_type: str,
    *,
    step_id: str | None = None,
    payload: dict[str, Any] | None = None,
) -> None:
    """Append the run's next event (sequence = MAX + 1) in one statement, or hold it for
    the enclosing `events_in_one_statement`.

    The caller holds the run row lock (or SQLite's write lock): MAX + 1 cannot race.
    """
    event = (run_id, event_type, step_id, payload)
    pending = _pending_events.get()
    if pending is not None:
        pending.append(event)
    else:
        _write_events([event])


def last_event_is(
    run_id: str, event_type: str, *, step_id: str | None, code: str | None
) -> bool:
    """Whether the run's latest event (held ones included) is `event_type` for `step_id`
    with payload `code`."""
    pending = [e for e in (_pending_events.get() or []) if e[0] == run_id]
    if pending:
        _, last_type, last_step, payload = pending[-1]
    else:
        last = (
            WorkflowEvent.objects.filter(workflow_run_id=run_id)
            .order_by("-sequence")
            .first()
        )
        if last is None:
            return False
        last_type, last_step, payload = last.event_type, last.step_id, last.payload_json
    return (
        last_type == event_type
        and last_step == step_id
        and (payload or {}).get("code") == code
    )


def append_operator_event(
    run_id: str | None, action: str, *, actor: str | None, reason: str | None
) -> None:
    """`operator_<action>` on the run an operator acted on, naming who and why (the audit
    trail in the ledger itself; the admin's LogEntry is the other half). No run, no event.

    The caller holds the run row lock, or the run is terminal (requeue, dead-letter): no
    other writer appends events to a finished run, and the (run, sequence) unique key
    turns the rare race into an error rather than a duplicate.
    """
    if run_id is None or actor is None:
        return
    payload: dict[str, Any] = {"user": actor}
    if reason:
        payload["reason"] = reason
    append_event(run_id, f"operator_{action}", payload=payload)


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


def step_max_per_profile(step: dict[str, Any]) -> int | None:
    routing = step.get("routing")
    if not isinstance(routing, dict):
        target = step.get("target")
        routing = target.get("routing") if isinstance(target, dict) else None
    value = routing.get("maxPerProfile") if isinstance(routing, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value
