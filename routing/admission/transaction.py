"""Route admission: one event in, one decision out (docs/upstream.md §3), under the admission lock.

`route_event` is the single entry point of the `route_event` command and the API; drains
call `admit` inside their own transaction (the inbox row is written in it). Two stages:
1. Plan (no store access): validate the envelope and options, check todos-task eligibility,
   resolve the project path, group, route scope, idempotency key, names, template and the
   render-time account per role. Bad input raises ValidationError and writes nothing.
2. The admission transaction (docs/upstream.md §3.6), after `admission_lock()`, in one pass (`admit`): one
   statement finds the rows to reuse and reads the active counts, one reads the pool
   (loads, cooldowns, the members' registry rows); then the decision: dedupe (upstream's
   early dedupe of a todos task that ran or runs, from the same lookup, writing nothing),
   re-admission, throttle, pool assignment; then the writes: invocation create-or-get,
   upsert, and either a recorded deferral or the spec, one-shot loop, admitted item, and a
   `queued` run with one `pending` step run per step carrying its account.

Dry runs execute the same transaction and roll it back, so they report exactly the decision
a real call would make now (loopsweb's dry-run; upstream's never opened the store).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from domain import reasons
from domain.errors import ValidationError
from domain.events import Envelope, load_envelope, parse_envelope
from domain.keys import TODOS_TASK
from domain.readmission import readmission_decision
from domain.throttle import AdmissionDecision, ThrottleCounts, pool_deferral_decision
from ledger.hosts import project_check_here
from ledger.lock import admission_lock
from ledger.models import (
    KEEP_WORK_ITEM_STATUSES,
    WorkflowInvocation,
    WorkflowWorkItem,
    WorkItemDeferral,
    WorkItemStatus,
)
from ledger.queue import enqueue_run_workflow
from ledger.selectors import AdmissionRows, admission_rows
from ledger.services import work_item_admit
from routing.admission.decide import (
    Hold,
    PoolView,
    Precheck,
    pool_assignment_now,
    precheck,
)
from routing.admission.options import RouteOptions
from routing.admission.plan import (
    RoutePlan,
    plan_reads,
    plan_route,
    plan_stored_route,
    retry_pending,
    route_options_resolve,
)
from routing.admission.results import CREATED, DEDUPED, THROTTLED, RouteResult
from routing.admission.rows import (
    admitted_reason,
    created_result,
    invocation_refresh,
    invocation_reuse_or_create,
    loop_description,
    pool_body,
    spec_reuse_or_create,
    work_item_upsert,
)

# --- stage 2: the admission transaction -------------------------------------------------------


class RouteRefused(ValidationError):
    """A plan's refusal (`RoutePlan.refusal`), raised by admission after the early dedupe
    and before any write: the caller's transaction holds nothing of it."""


def refusal_of(plan: RoutePlan) -> RouteRefused:
    """The error of a plan whose refusal stands: the early dedupe found nothing to dedupe."""
    assert plan.refusal is not None
    return RouteRefused(plan.refusal)


class _DryRunRollback(Exception):
    """Raised at the end of a dry-run admission to undo everything it wrote."""

    def __init__(self, result: RouteResult) -> None:
        self.result = result


def admit(
    plan: RoutePlan,
    *,
    now: datetime,
    dry_run: bool = False,
    enqueue: bool = True,
    early_dedupe: bool = False,
    hold_when_full: bool = False,
) -> RouteResult | Hold:
    """Stage 2 for one plan (`_admit`); a result carries the plan's task and, when no
    spec row is part of it, the workflow body the plan rendered."""
    outcome = _admit(
        plan,
        now=now,
        dry_run=dry_run,
        enqueue=enqueue,
        early_dedupe=early_dedupe,
        hold_when_full=hold_when_full,
    )
    if isinstance(outcome, RouteResult):
        outcome.task = plan.task
        outcome.extra = outcome.extra or plan.result_extra()
        if outcome.workflow is None:
            outcome.workflow_body = plan.spec
            outcome.workflow_name = plan.workflow_name
    return outcome


def _admit(
    plan: RoutePlan,
    *,
    now: datetime,
    dry_run: bool,
    enqueue: bool,
    early_dedupe: bool,
    hold_when_full: bool,
) -> RouteResult | Hold:
    """Stage 2 for one plan, in one pass: call inside a transaction, after `admission_lock()`.

    Reads first, each once: the rows to reuse and the active counts in one statement, then
    (when the pool decides) the loads, cooldowns and the members' registry rows in another.
    Then the decision (`decide.precheck`), and only then the writes (`rows`).
    - `early_dedupe` (todos-task outside a dry run, as upstream's early dedupe): an item that
      ran or runs and is not due for re-admission is deduped with its own invocation, and
      nothing is written.
    - `hold_when_full` (drains): when the caps (or the pool) are already full for an item that
      has not run, return the Hold, written nothing (the drain's pre-check hold), instead of
      recording a deferral.
    - a plan with a `refusal` (worktree required, no git work tree) raises RouteRefused
      right after the early dedupe, before any write: deduped when the item ran or runs,
      refused otherwise (docs/upstream.md §3.2.9, §3.2.10).
    - `enqueue=False`: the caller hands a created run to the runner (`enqueue_run_workflow`)
      itself, after its own writes in the same transaction.
    """
    found, existing = _lookup(plan)
    stored = _stored_retry(plan, existing)
    if stored is not None:
        return _admit(
            stored,
            now=now,
            dry_run=dry_run,
            enqueue=enqueue,
            early_dedupe=early_dedupe,
            hold_when_full=hold_when_full,
        )
    known = _Known(
        found=found,
        existing=existing,
        routed=existing is not None and existing.status in KEEP_WORK_ITEM_STATUSES,
    )
    deduped = _dedupe(plan, known, now=now, dry_run=dry_run, early_dedupe=early_dedupe)
    if deduped is not None:
        return deduped
    checked, counts = _precheck(plan, found, now)
    if checked.hold is not None and hold_when_full and not known.routed:
        return checked.hold
    decision, pool_seen = _pool_decision(plan, checked, counts)
    denied = decision if decision is not None and not decision.allowed else None
    item, invocation = _upsert(plan, known, denied)
    if denied is not None:
        return _defer(plan, item, invocation, denied, pool_seen, dry_run=dry_run)
    return _create(
        plan,
        item,
        invocation,
        checked.view,
        decision,
        spec_id=found.spec_id,
        now=now,
        dry_run=dry_run,
        enqueue=enqueue,
    )


@dataclass
class _Known:
    """What admission found of the plan's item before it decides: the lookup, the item
    (None: new), whether it was routed (KEEP_WORK_ITEM_STATUSES), and the invocation a
    routed item reuses once its dedupe is decided."""

    found: AdmissionRows
    existing: WorkflowWorkItem | None
    routed: bool
    invocation: WorkflowInvocation | None = None
    invocation_created: bool = False


def _stored_retry(
    plan: RoutePlan, existing: WorkflowWorkItem | None
) -> RoutePlan | None:
    """The plan of a retry the caps deferred: admitted (or held) with its own stored route,
    whichever drain or delivery meets it (routing.admission.retry); None otherwise."""
    if existing is None or plan.retry or not retry_pending(existing):
        return None
    stored = plan_stored_route(existing.route_options_json or {}, reads=plan_reads())
    return stored if isinstance(stored, RoutePlan) else None


def _upsert(
    plan: RoutePlan, known: _Known, denied: AdmissionDecision | None
) -> tuple[WorkflowWorkItem, WorkflowInvocation]:
    """The item, queued (or deferred when `denied`), with its invocation (reused, or made
    now when the dedupe did not already)."""
    invocation = known.invocation
    if invocation is None:
        invocation, known.invocation_created = invocation_reuse_or_create(
            plan, known.found.invocation_id, known.existing
        )
    item = work_item_upsert(
        existing=known.existing,
        plan=plan,
        invocation=invocation,
        status=WorkItemStatus.DEFERRED if denied else WorkItemStatus.QUEUED,
        reason=denied.reason if denied else None,
        reason_code=denied.reason_code if denied else None,
        save=denied is not None,
    )
    if (
        not known.invocation_created
    ):  # a row made from this plan already holds these values
        invocation_refresh(invocation, plan)
    return item, invocation


def _lookup(plan: RoutePlan) -> tuple[AdmissionRows, WorkflowWorkItem | None]:
    """The rows to reuse and the active counts (one statement), and the item, if any."""
    found = admission_rows(
        route_key=plan.route_key,
        idempotency_key=plan.idempotency_key,
        workflow_name=plan.workflow_name,
        counts=plan.limits.any_set,
        scope=plan.scope,
        project_key=plan.project_path,
        project_group=plan.project_group,
    )
    if found.work_item_id is None:
        return found, None
    existing = WorkflowWorkItem.objects.select_related(
        "invocation", "workflow", "loop"
    ).get(pk=found.work_item_id)
    return found, existing


def _dedupe(
    plan: RoutePlan, known: _Known, *, now: datetime, dry_run: bool, early_dedupe: bool
) -> RouteResult | None:
    """The dedupe of an item that ran or runs (docs/upstream.md §3.2.9): early (writing
    nothing) or after its invocation is reused; the plan's refusal raised in between
    (docs/upstream.md §3.2.10); a finished item due for re-admission requeued. None: go on
    to decide."""
    existing = known.existing
    readmission = None
    if existing is not None and known.routed:
        readmission = readmission_decision(
            route_key=plan.route_key,
            status=existing.status,
            attempts=existing.attempts,
            finished_at=existing.updated_at,
            now=now,
        )
        if not readmission.readmit and early_dedupe:
            return _deduped(plan, existing, existing.invocation)
    if plan.refusal is not None:
        # Refused only now that the early dedupe found nothing to dedupe; nothing has been
        # written yet.
        raise refusal_of(plan)
    if existing is None or readmission is None:
        return None
    known.invocation, known.invocation_created = invocation_reuse_or_create(
        plan, known.found.invocation_id, existing
    )
    if not readmission.readmit:
        return _deduped(plan, existing, known.invocation, dry_run=dry_run)
    # A finished item is requeued (not active before or after: the counts still hold).
    existing.requeue(readmission.reason or "")
    return None


def _deduped(
    plan: RoutePlan,
    item: WorkflowWorkItem,
    invocation: WorkflowInvocation | None,
    *,
    dry_run: bool = False,
) -> RouteResult:
    return RouteResult(
        kind=DEDUPED,
        idempotency_key=plan.idempotency_key,
        event=plan.envelope,
        work_item=item,
        invocation=invocation,
        workflow=item.workflow,
        loop=item.loop,
        task_id=plan.task_id,
        dry_run=dry_run,
    )


def _precheck(
    plan: RoutePlan, found: AdmissionRows, now: datetime
) -> tuple[Precheck, ThrottleCounts | None]:
    """Throttle first (docs/upstream.md §3.7 order), then the pool: both read rows inside
    this transaction."""
    seen = found.active
    counts = (
        None
        if seen is None
        else ThrottleCounts(
            scope=seen.scope, project=seen.project, project_group=seen.project_group
        )
    )
    checked = precheck(
        plan,
        counts=lambda: counts or ThrottleCounts(),
        view=lambda: pool_assignment_now(plan, now),
    )
    return checked, counts


def _pool_decision(
    plan: RoutePlan, checked: Precheck, counts: ThrottleCounts | None
) -> tuple[AdmissionDecision | None, dict[str, Any]]:
    """The decision (the throttle's, or the pool's deferral) and what the pool showed."""
    decision, view = checked.decision, checked.view
    if view is None:
        if checked.hold is not None and (decision is None or decision.allowed):
            # A route pinned to an account that cannot start (decide.pinned_hold).
            decision = pool_deferral_decision(
                scope=plan.scope,
                project_path=plan.project_path,
                project_group=plan.project_group,
                counts=counts,
                limits=plan.limits,
                reason=checked.hold.reason,
                reason_code=checked.hold.code,
            )
        return decision, {}
    pool_seen = {
        "accounts": {p: view.loads.get(p, 0) for p in plan.pool},
        "cooling": {p: until.isoformat() for p, until in view.cooling.items()},
    }
    if view.windows:
        pool_seen["windows"] = view.windows_snapshot()
    if view.assignment.deferred:
        decision = pool_deferral_decision(
            scope=plan.scope,
            project_path=plan.project_path,
            project_group=plan.project_group,
            counts=counts,
            limits=plan.limits,
            reason=view.deferral_reason,
            reason_code=view.assignment.reason_code or reasons.PROFILE_CAP,
        )
    return decision, pool_seen


def _requeue_of(item: WorkflowWorkItem) -> dict[str, Any] | None:
    """What a re-admitted item's result reports of its previous attempt."""
    if item.attempts > 0 and item.status == WorkItemStatus.QUEUED:
        return {
            "previousWorkItemId": item.id,
            "previousAttempts": item.attempts,
            "reason": item.last_reason,
        }
    return None


def _defer(
    plan: RoutePlan,
    item: WorkflowWorkItem,
    invocation: WorkflowInvocation,
    decision: AdmissionDecision,
    pool_seen: Mapping[str, Any],
    *,
    dry_run: bool,
) -> RouteResult:
    """The deferral the caps or the pool decided: recorded, the item deferred."""
    WorkItemDeferral.objects.create(
        work_item=item,
        reason_code=decision.reason_code or "",
        reason=decision.reason or "",
        route_scope=plan.scope,
        project_key=plan.project_path,
        project_group=plan.project_group,
        counts_json={
            **decision.counts.to_dict(include_group=bool(plan.project_group)),
            **pool_seen,
        },
        limits_json={**plan.limits.to_dict(), "maxPerProfile": plan.max_per_profile},
    )
    return RouteResult(
        kind=THROTTLED,
        idempotency_key=plan.idempotency_key,
        event=plan.envelope,
        reason=decision.reason,
        reason_code=decision.reason_code,
        work_item=item,
        invocation=invocation,
        throttle=decision,
        task_id=plan.task_id,
        requeue=_requeue_of(item),
        dry_run=dry_run,
    )


def _create(
    plan: RoutePlan,
    item: WorkflowWorkItem,
    invocation: WorkflowInvocation,
    view: PoolView | None,
    decision: AdmissionDecision | None,
    *,
    spec_id: str | None,
    now: datetime,
    dry_run: bool,
    enqueue: bool,
) -> RouteResult:
    """The admission: the spec (reused or new), the one-shot loop and its queued run."""
    requeue = _requeue_of(item)
    body, account_profiles = pool_body(plan, view.assignment if view else None)
    spec = spec_reuse_or_create(plan, body, spec_id)
    loop, run = work_item_admit(
        item=item,
        spec=spec,
        invocation=invocation,
        loop_name=plan.loop_name,
        loop_description=loop_description(plan, spec),
        reason=admitted_reason(plan),
        now=now,
        max_attempts=plan.max_attempts,
        retry_delay_ms=plan.retry_delay_ms,
    )
    if requeue is not None:
        requeue = {
            **requeue,
            "attempt": item.attempts,
            "newWorkflowId": spec.id,
            "newLoopId": loop.id,
        }
    if not dry_run and enqueue:
        enqueue_run_workflow(run.id)
    return created_result(
        plan,
        item=item,
        invocation=invocation,
        spec=spec,
        loop=loop,
        run=run,
        decision=decision,
        account_profiles=account_profiles,
        requeue=requeue,
        dry_run=dry_run,
    )


def hand_over(result: RouteResult) -> None:
    """Hand a created run to the runner (inside the admitting transaction: see
    `ledger.queue.enqueue_run_workflow`); anything else has no run to hand over."""
    if result.kind == CREATED and result.run is not None:
        enqueue_run_workflow(result.run.id)


def projects_check_here(plans: Iterable[RoutePlan]) -> None:
    """Before an admission takes its lock (the plan writes nothing): this machine, when it
    is a live host whose roots hold a plan's project it has not recorded yet, checks its
    disk now and records what it found (ledger.hosts.project_check_here), so the new run is
    placed at once rather than after the heartbeat's check (ledger.queue
    host_projects_refresh)."""
    for project in sorted({plan.project_path for plan in plans}):
        project_check_here(project)


def route_event(
    *,
    kind: str,
    envelope: Mapping[str, Any] | Envelope | str,
    options: RouteOptions,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    now: datetime | None = None,
    enqueue: bool = True,
    then: Callable[[RouteResult], None] | None = None,
) -> RouteResult:
    """Route one event envelope (a dict, a parsed Envelope, or JSON text).

    `enqueue=False` admits without handing the run to the runner (a caller that rolls the
    admission back must not queue, or log, a task for it). `then(result)` runs with every
    result that is not an error: inside the admission's transaction, after the decision and
    before the run is handed over (an API delivery records the outcome on its inbox row
    there, in the same commit); alone for an event skipped at planning.

    Returns a RouteResult of kind created, deduped, throttled or skipped. Raises
    ValidationError for bad input, before anything is written. One transaction (a savepoint
    when nested in an outer one), one lock, one pass (`admit`): upstream's early dedupe of a
    todos task that ran or runs is made there, under the lock, from the same lookup.
    """
    if isinstance(envelope, Envelope):
        parsed = envelope
    elif isinstance(envelope, str):
        parsed = load_envelope(envelope, max_depth=settings.LOOPSWEB_MAX_JSON_DEPTH)
    else:
        parsed = parse_envelope(envelope)
    now = now or timezone.now()
    reads = plan_reads()
    plan = plan_route(
        kind=kind,
        envelope=parsed,
        options=route_options_resolve(options, registered=reads.registered),
        env=os.environ if env is None else env,
        cwd=cwd or os.getcwd(),
        reads=reads,
    )
    if isinstance(plan, RouteResult):  # skipped: no admission, no transaction
        if then is not None:
            then(plan)
        return plan
    if not options.dry_run:
        projects_check_here([plan])
        with transaction.atomic():
            admission_lock()
            result = admit(
                plan,
                now=now,
                enqueue=False,
                early_dedupe=plan.route_key == TODOS_TASK,
            )
            assert isinstance(result, RouteResult)  # no holds without hold_when_full
            if then is not None:
                then(result)
            if enqueue:
                hand_over(result)
            return result
    try:
        with transaction.atomic():
            admission_lock()
            result = admit(plan, now=now, dry_run=True)
            assert isinstance(result, RouteResult)
            if then is not None:
                then(result)
            raise _DryRunRollback(result)
    except _DryRunRollback as rollback:
        return rollback.result
