"""Route admission: one event in, one decision out (reference §3), under the admission lock.

`route_event` is the single entry point of the `route_event` command and the API; drains
call `admit` inside their own transaction (the inbox row is written in it). Two stages:
1. Plan (no store access): validate the envelope and options, check todos-task eligibility,
   resolve the project path, group, route scope, idempotency key, names, template and the
   render-time account per role. Bad input raises ValidationError and writes nothing.
2. The admission transaction (§3.6), after `admission_lock()`, in one pass (`admit`): one
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

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from domain import reasons
from domain.events import (
    Envelope,
    load_envelope,
    parse_envelope,
)
from domain.keys import (
    TODOS_TASK,
)
from domain.pool import PoolAssignment, assign_pool_auth_profiles
from domain.readmission import readmission_decision
from domain.templates import (
    apply_pool_profiles,
)
from domain.throttle import (
    AdmissionDecision,
    ThrottleCounts,
    admission_decision,
    pool_deferral_decision,
)
from ledger.lock import admission_lock
from ledger.models import (
    KEEP_WORK_ITEM_STATUSES,
    SpecStatus,
    WorkflowInvocation,
    WorkflowSpec,
    WorkflowWorkItem,
    WorkItemDeferral,
    WorkItemStatus,
)
from ledger.queue import enqueue_run_workflow
from ledger.selectors import (
    AccountLimits,
    RegisteredAccount,
    account_state,
    admission_rows,
    registered_providers,
)
from ledger.services import join_reason, work_item_admit
from routing.admission.options import RouteOptions
from routing.admission.plan import RoutePlan, check_plan_fits_columns, plan_route
from routing.admission.results import CREATED, DEDUPED, THROTTLED, RouteResult

# --- stage 2: the admission transaction -------------------------------------------------------


class _DryRunRollback(Exception):
    """Raised at the end of a dry-run admission to undo everything it wrote."""

    def __init__(self, result: RouteResult) -> None:
        self.result = result


def _invocation_reuse_or_create(
    plan: RoutePlan, invocation_id: str | None, item: WorkflowWorkItem | None
) -> tuple[WorkflowInvocation, bool]:
    """The event's invocation by (source kind, dedupe key), created when there is none.

    An existing row is returned unchanged (the caller refreshes it). `invocation_id` comes
    from `admission_rows`; the item's own invocation is used when it is that row.
    """
    if invocation_id is not None:
        if item is not None and item.invocation_id == invocation_id:
            return item.invocation, False
        return WorkflowInvocation.objects.get(pk=invocation_id), False
    created = new_invocation(plan)
    created.save(force_insert=True)
    return created, True


def new_invocation(plan: RoutePlan) -> WorkflowInvocation:
    """The event's invocation for a plan, unsaved."""
    return WorkflowInvocation(
        source_kind="event",
        source_dedupe_key=plan.idempotency_key,
        **plan.invocation_fields,
    )


def new_spec(plan: RoutePlan, body: dict[str, Any]) -> WorkflowSpec:
    """A new active spec for a plan's (profile-applied) workflow body, unsaved."""
    noun = f"task {plan.task_id}" if plan.task_id else f"event {plan.envelope.id}"
    return WorkflowSpec(
        name=plan.workflow_name,
        description=f"{plan.template_id} for {noun}",
        version=body.get("version") or 1,
        goal_json=body.get("goal"),
        steps_json=body["steps"],
    )


def loop_description(plan: RoutePlan, spec: WorkflowSpec) -> str:
    noun = f"task {plan.task_id}" if plan.task_id else f"event {plan.envelope.id}"
    return f"Run {spec.name} once for {noun}; idempotency={plan.idempotency_key}" + (
        f"; event={plan.envelope.id}" if plan.task_id else ""
    )


def _invocation_refresh(invocation: WorkflowInvocation, plan: RoutePlan) -> None:
    """§1.1 refresh: nullable fields take the new value when non-null, the rest overwrite."""
    fields = plan.invocation_fields
    for name in (
        "template_id",
        "source_id",
        "subject_id",
        "subject_path",
        "scope_json",
        "output_policy_json",
    ):
        if fields.get(name) is not None:
            setattr(invocation, name, fields[name])
    for name in ("source_json", "subject_kind", "subject_json", "intent"):
        setattr(invocation, name, fields[name])
    invocation.save()


def _work_item_upsert(
    *,
    existing: WorkflowWorkItem | None,
    plan: RoutePlan,
    invocation: WorkflowInvocation,
    status: str,
    reason: str | None,
    reason_code: str | None,
    save: bool,
) -> WorkflowWorkItem:
    """§2.4: insert, or update a queued/deferred row (KEEP statuses never reach here).

    With `save=False` the row is left for the admission to write once, in its final
    `admitted` state (same transaction, one statement instead of two).
    """
    values = {
        "invocation": invocation,
        "source_type": plan.envelope.type,
        "source_ref": plan.envelope.id,
        "subject_ref": plan.subject_ref,
        "project_key": plan.project_path,
        "project_group": plan.project_group,
        "route_scope": plan.scope,
        "priority": 0,
        "next_attempt_at": None,
    }
    if existing is None:
        item = WorkflowWorkItem(
            route_key=plan.route_key,
            idempotency_key=plan.idempotency_key,
            status=status,
            last_reason=reason,
            reason_code=reason_code,
            **values,
        )
        if save:
            item.save(force_insert=True)
        return item
    item = existing
    for name, value in values.items():
        setattr(item, name, value)
    if item.attempts > 0 and item.status in (
        WorkItemStatus.QUEUED,
        WorkItemStatus.DEFERRED,
    ):
        item.last_reason = join_reason(item.last_reason, reason)
    else:
        item.last_reason = reason if reason is not None else item.last_reason
    item.status = status
    item.reason_code = reason_code
    item.workflow = item.loop = item.workflow_run = None
    item.lease_expires_at = None
    if save:
        item.save()
    return item


def admitted_reason(plan: RoutePlan) -> str:
    return f"admitted by {plan.route_key} route"


def _requeue_for_readmission(item: WorkflowWorkItem, reason: str) -> None:
    # §2.1 requeue: bindings, next attempt and lease cleared; attempts kept (0.4.12).
    item.status = WorkItemStatus.QUEUED
    item.workflow = item.loop = item.workflow_run = None
    item.next_attempt_at = item.lease_expires_at = None
    item.last_reason = reason
    item.reason_code = None
    item.save()


def _spec_reuse_or_create(
    plan: RoutePlan, body: dict[str, Any], active_id: str | None
) -> WorkflowSpec:
    """The active spec of this name when its content is the same; else archive it and
    create a new one. `active_id` (from `admission_rows`) is that active spec, if any."""
    version, goal, steps = body.get("version") or 1, body.get("goal"), body["steps"]
    if active_id is not None:
        current = WorkflowSpec.objects.get(pk=active_id)
        same = json.dumps(
            [current.version, current.goal_json, current.steps_json], sort_keys=True
        ) == json.dumps([version, goal, steps], sort_keys=True)
        if same:
            return current
        current.status = SpecStatus.ARCHIVED
        current.save(update_fields=["status", "updated_at"])
    spec = new_spec(plan, body)
    spec.save(force_insert=True)
    return spec


@dataclass(frozen=True)
class PoolView:
    """A pool assignment with the loads and cooldowns it was decided on."""

    assignment: PoolAssignment
    loads: dict[str, int]
    cooling: dict[str, datetime]

    @property
    def deferral_reason(self) -> str:
        """Why the pool defers (a cooldown says when the first member frees)."""
        reason = self.assignment.reason or "pool deferred"
        if self.assignment.reason_code == reasons.COOLDOWN and self.cooling:
            first_free = min(self.cooling.values())
            reason = f"{reason} until {first_free.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        return reason


def pool_assignment_now(plan: RoutePlan, now: datetime) -> PoolView:
    """Least-loaded assignment for this plan's pool from the ledger as it is now (one read:
    the loads, the cooldowns and the pool members' registry rows)."""
    state = account_state(now=now, accounts=plan.pool)
    return pool_view(
        plan,
        loads=state.load.total(),
        cooling=state.cooling,
        registry=state.limits,
    )


def pool_view(
    plan: RoutePlan,
    *,
    loads: dict[str, int],
    cooling: dict[str, datetime],
    registry: Mapping[str, AccountLimits | RegisteredAccount],
) -> PoolView:
    """Least-loaded assignment for this plan's pool from the given loads, cooldowns and
    account registry rows (disabled members are absent; a member's max_running caps it)."""
    members_cooling = {p: until for p, until in cooling.items() if p in plan.pool}
    members = {p.strip() for p in plan.pool}
    assignment = assign_pool_auth_profiles(
        list(plan.pool),
        loads,
        plan.seed,
        list(plan.roles),
        plan.max_per_profile,
        cooling=tuple(members_cooling),
        disabled=tuple(
            name
            for name, row in registry.items()
            if name in members and not row.enabled
        ),
        account_caps={
            name: row.max_running
            for name, row in registry.items()
            if name in members and row.max_running is not None
        },
    )
    return PoolView(assignment=assignment, loads=loads, cooling=members_cooling)


@dataclass(frozen=True)
class Held:
    """A cap already full for an item not yet routed (`admit(hold_when_full=True)`): nothing
    was written. `reason` and `code` are what a drain's pre-check hold reports."""

    reason: str
    code: str


def _admit(
    plan: RoutePlan,
    *,
    now: datetime,
    dry_run: bool,
    enqueue: bool = True,
    early_dedupe: bool = False,
) -> RouteResult:
    """`admit` without holds (the batch's path for rows that exist; route_event's)."""
    result = admit(
        plan, now=now, dry_run=dry_run, enqueue=enqueue, early_dedupe=early_dedupe
    )
    assert isinstance(result, RouteResult)
    return result


def admit(
    plan: RoutePlan,
    *,
    now: datetime,
    dry_run: bool = False,
    enqueue: bool = True,
    early_dedupe: bool = False,
    hold_when_full: bool = False,
) -> RouteResult | Held:
    """Stage 3 for one plan, in one pass: call inside a transaction, after `admission_lock()`.

    Reads first, each once: the rows to reuse and the active counts in one statement, then
    (when the pool decides) the loads, cooldowns and the members' registry rows in another.
    Then the decision, and only then the writes.
    - `early_dedupe` (todos-task outside a dry run, as upstream's early dedupe): an item that
      ran or runs and is not due for re-admission is deduped with its own invocation, and
      nothing is written.
    - `hold_when_full` (drains): when the caps (or the pool) are already full for an item that
      has not run, return Held, written nothing (the drain's pre-check hold), instead of
      recording a deferral.
    - `enqueue=False`: the caller hands a created run to the runner (`enqueue_run_workflow`)
      itself, after its own writes in the same transaction.
    """
    envelope = plan.envelope
    found = admission_rows(
        route_key=plan.route_key,
        idempotency_key=plan.idempotency_key,
        workflow_name=plan.workflow_name,
        counts=plan.limits.any_set,
        scope=plan.scope,
        project_key=plan.project_path,
        project_group=plan.project_group,
    )
    existing = None
    if found.work_item_id is not None:
        existing = WorkflowWorkItem.objects.select_related(
            "invocation", "workflow", "loop"
        ).get(pk=found.work_item_id)
    routed = existing is not None and existing.status in KEEP_WORK_ITEM_STATUSES
    invocation: WorkflowInvocation | None = None
    invocation_created = False
    if existing is not None and routed:
        check_plan_fits_columns(plan)
        readmission = readmission_decision(
            route_key=plan.route_key,
            status=existing.status,
            attempts=existing.attempts,
            finished_at=existing.updated_at,
            now=now,
        )
        if not readmission.readmit and early_dedupe:
            return RouteResult(
                kind=DEDUPED,
                idempotency_key=plan.idempotency_key,
                event=envelope,
                work_item=existing,
                invocation=existing.invocation,
                workflow=existing.workflow,
                loop=existing.loop,
                task_id=plan.task_id,
            )
        invocation, invocation_created = _invocation_reuse_or_create(
            plan, found.invocation_id, existing
        )
        if not readmission.readmit:
            return RouteResult(
                kind=DEDUPED,
                idempotency_key=plan.idempotency_key,
                event=envelope,
                work_item=existing,
                invocation=invocation,
                workflow=existing.workflow,
                loop=existing.loop,
                task_id=plan.task_id,
                dry_run=dry_run,
            )
        # A finished item is requeued (not active before or after: the counts still hold).
        _requeue_for_readmission(existing, readmission.reason or "")

    # Throttle first (§3.7 order), then the pool: both read rows inside this transaction.
    decision: AdmissionDecision | None = None
    counts: ThrottleCounts | None = None
    if found.active is not None:
        seen = found.active
        counts = ThrottleCounts(
            scope=seen.scope, project=seen.project, project_group=seen.project_group
        )
        decision = admission_decision(
            scope=plan.scope,
            project_path=plan.project_path,
            project_group=plan.project_group,
            counts=counts,
            limits=plan.limits,
        )
        if hold_when_full and not routed and not decision.allowed:
            return Held(
                decision.reason or "", decision.reason_code or reasons.ROUTE_CAP
            )
    assignment: PoolAssignment | None = None
    pool_seen: dict[str, Any] = {}
    if plan.pool_active and (decision is None or decision.allowed):
        view = pool_assignment_now(plan, now)
        assignment, members_cooling = view.assignment, view.cooling
        if hold_when_full and not routed and assignment.deferred:
            return Held(
                view.deferral_reason, assignment.reason_code or reasons.PROFILE_CAP
            )
        pool_seen = {
            "accounts": {p: view.loads.get(p, 0) for p in plan.pool},
            "cooling": {p: until.isoformat() for p, until in members_cooling.items()},
        }
        if assignment.deferred:
            reason = view.deferral_reason
            decision = pool_deferral_decision(
                scope=plan.scope,
                project_path=plan.project_path,
                project_group=plan.project_group,
                counts=counts,
                limits=plan.limits,
                reason=reason,
                reason_code=assignment.reason_code or reasons.PROFILE_CAP,
            )
    if invocation is None:
        check_plan_fits_columns(plan)
        invocation, invocation_created = _invocation_reuse_or_create(
            plan, found.invocation_id, existing
        )

    deferred = decision is not None and not decision.allowed
    item = _work_item_upsert(
        existing=existing,
        plan=plan,
        invocation=invocation,
        status=WorkItemStatus.DEFERRED if deferred else WorkItemStatus.QUEUED,
        reason=decision.reason if deferred else None,
        reason_code=decision.reason_code if deferred else None,
        save=deferred,
    )
    requeue: dict[str, Any] | None = None
    if item.attempts > 0 and item.status == WorkItemStatus.QUEUED:
        requeue = {
            "previousWorkItemId": item.id,
            "previousAttempts": item.attempts,
            "reason": item.last_reason,
        }
    if not invocation_created:  # a row made from this plan already holds these values
        _invocation_refresh(invocation, plan)

    if deferred:
        assert decision is not None
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
            limits_json={
                **plan.limits.to_dict(),
                "maxPerProfile": plan.max_per_profile,
            },
        )
        return RouteResult(
            kind=THROTTLED,
            idempotency_key=plan.idempotency_key,
            event=envelope,
            reason=decision.reason,
            reason_code=decision.reason_code,
            work_item=item,
            invocation=invocation,
            throttle=decision,
            task_id=plan.task_id,
            requeue=requeue,
            dry_run=dry_run,
        )

    body = plan.spec
    account_profiles: dict[str, str] | None = None
    if assignment is not None and assignment.profiles:
        body = apply_pool_profiles(plan.spec, assignment.profiles, plan.provider)
        account_profiles = dict(assignment.profiles)
    spec = _spec_reuse_or_create(plan, body, found.spec_id)
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
    return RouteResult(
        kind=CREATED,
        idempotency_key=plan.idempotency_key,
        event=envelope,
        work_item=item,
        invocation=invocation,
        workflow=spec,
        loop=loop,
        run=run,
        throttle=decision,
        account_profiles=account_profiles,
        route_scope=plan.scope if account_profiles else None,
        requeue=requeue,
        task_id=plan.task_id,
        sandbox_preflight=list(plan.sandbox_preflight),
        dry_run=dry_run,
    )


def hand_over(result: RouteResult) -> None:
    """Hand a created run to the runner (inside the admitting transaction: see
    `ledger.tasks.enqueue_run_workflow`); anything else has no run to hand over."""
    if result.kind == CREATED and result.run is not None:
        enqueue_run_workflow(result.run.id)


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
    plan = plan_route(
        kind=kind,
        envelope=parsed,
        options=options,
        env=os.environ if env is None else env,
        cwd=cwd or os.getcwd(),
        registered=registered_providers(),
    )
    if isinstance(plan, RouteResult):  # skipped: no admission, no transaction
        if then is not None:
            then(plan)
        return plan
    check_plan_fits_columns(plan)  # bad input never takes the lock
    if not options.dry_run:
        with transaction.atomic():
            admission_lock()
            result = _admit(
                plan,
                now=now,
                dry_run=False,
                enqueue=False,
                early_dedupe=plan.route_key == TODOS_TASK,
            )
            if then is not None:
                then(result)
            if enqueue:
                hand_over(result)
            return result
    try:
        with transaction.atomic():
            admission_lock()
            result = _admit(plan, now=now, dry_run=True)
            if then is not None:
                then(result)
            raise _DryRunRollback(result)
    except _DryRunRollback as rollback:
        return rollback.result
