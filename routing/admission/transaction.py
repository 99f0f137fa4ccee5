"""Route admission: one event in, one decision out (reference §3), under the admission lock.

`route_event` is the single entry point used by the `route_event` command, drains and the
API. It runs in three stages:
1. Plan (no store access): validate the envelope and options, check todos-task eligibility,
   resolve the project path, group, route scope, idempotency key, names, template and the
   render-time account per role. Bad input raises ValidationError and writes nothing.
2. Early dedupe (a plain read): an item that already ran or is running is `deduped` without
   taking the lock, unless a finished todos-task item is due for re-admission (§2.5).
3. The admission transaction (§3.6), after `admission_lock()`: invocation create-or-get,
   dedupe, re-admission, throttle decision, pool assignment with the load read in the same
   transaction, upsert; then either a recorded deferral or the spec, one-shot loop, admitted
   item, and a `queued` run with one `pending` step run per step carrying its account.

Dry runs execute the same transaction and roll it back, so they report exactly the decision
a real call would make now (loopsweb's dry-run; upstream's never opened the store).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

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
from ledger.selectors import (
    RegisteredAccount,
    account_registry,
    account_state,
    active_counts,
    admission_rows,
    registered_providers,
)
from ledger.services import join_reason, work_item_admit
from ledger.tasks import enqueue_run_workflow
from routing.admission.options import RouteOptions
from routing.admission.plan import RoutePlan, check_plan_fits_columns, plan_route
from routing.admission.results import CREATED, DEDUPED, THROTTLED, RouteResult
from routing.domain import reasons
from routing.domain.events import (
    Envelope,
    load_envelope,
    parse_envelope,
)
from routing.domain.keys import (
    TODOS_TASK,
)
from routing.domain.pool import PoolAssignment, assign_pool_auth_profiles
from routing.domain.readmission import readmission_decision
from routing.domain.templates import (
    apply_pool_profiles,
)
from routing.domain.throttle import (
    AdmissionDecision,
    ThrottleCounts,
    admission_decision,
    pool_deferral_decision,
)

# --- stage 3: the admission transaction -------------------------------------------------------


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
    """Least-loaded assignment for this plan's pool from the ledger as it is now."""
    state = account_state(now=now)
    return pool_view(
        plan,
        loads=state.load.total(),
        cooling=state.cooling,
        registry=account_registry(plan.pool),
    )


def pool_view(
    plan: RoutePlan,
    *,
    loads: dict[str, int],
    cooling: dict[str, datetime],
    registry: dict[str, RegisteredAccount],
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


def _admit(
    plan: RoutePlan, *, now: datetime, dry_run: bool, enqueue: bool = True
) -> RouteResult:
    envelope = plan.envelope
    found = admission_rows(
        route_key=plan.route_key,
        idempotency_key=plan.idempotency_key,
        workflow_name=plan.workflow_name,
    )
    existing = None
    if found.work_item_id is not None:
        existing = WorkflowWorkItem.objects.select_related("invocation").get(
            pk=found.work_item_id
        )
    invocation, invocation_created = _invocation_reuse_or_create(
        plan, found.invocation_id, existing
    )
    readmit_reason: str | None = None
    if existing is not None and existing.status in KEEP_WORK_ITEM_STATUSES:
        readmission = readmission_decision(
            route_key=plan.route_key,
            status=existing.status,
            attempts=existing.attempts,
            finished_at=existing.updated_at,
            now=now,
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
        readmit_reason = readmission.reason
        _requeue_for_readmission(existing, readmit_reason or "")

    # Throttle first (§3.7 order), then the pool: both read rows inside this transaction.
    decision: AdmissionDecision | None = None
    counts: ThrottleCounts | None = None
    if plan.limits.any_set:
        seen = active_counts(
            scope=plan.scope,
            project_key=plan.project_path,
            project_group=plan.project_group,
        )
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
    assignment: PoolAssignment | None = None
    pool_seen: dict[str, Any] = {}
    if plan.pool_active and (decision is None or decision.allowed):
        view = pool_assignment_now(plan, now)
        assignment, members_cooling = view.assignment, view.cooling
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


def _early_dedupe(plan: RoutePlan, now: datetime) -> RouteResult | None:
    """A read before the lock: items that ran or run need no decision (§3.2.9)."""
    # One unique-key look-up (no ORDER BY, no second read); most routed events find nothing.
    found = list(
        WorkflowWorkItem.objects.filter(
            route_key=plan.route_key,
            idempotency_key=plan.idempotency_key,
            status__in=KEEP_WORK_ITEM_STATUSES,
        ).select_related("workflow", "loop", "invocation")[:1]
    )
    if not found:
        return None
    item = found[0]
    readmission = readmission_decision(
        route_key=plan.route_key,
        status=item.status,
        attempts=item.attempts,
        finished_at=item.updated_at,
        now=now,
    )
    if readmission.readmit:
        return None
    return RouteResult(
        kind=DEDUPED,
        idempotency_key=plan.idempotency_key,
        event=plan.envelope,
        work_item=item,
        invocation=item.invocation,
        workflow=item.workflow,
        loop=item.loop,
        task_id=plan.task_id,
    )


def route_event(
    *,
    kind: str,
    envelope: Mapping[str, Any] | Envelope | str,
    options: RouteOptions,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    now: datetime | None = None,
    enqueue: bool = True,
) -> RouteResult:
    """Route one event envelope (a dict, a parsed Envelope, or JSON text).

    `enqueue=False` admits without handing the run to the runner: a dry-run drain admits
    for real inside a transaction it rolls back, and must not queue (or log) a task for it.

    Returns a RouteResult of kind created, deduped, throttled or skipped. Raises
    ValidationError for bad input, before anything is written. Nested inside an outer
    transaction (a dry-run drain) it runs in a savepoint; on its own it commits one
    transaction per event.
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
    if isinstance(plan, RouteResult):
        return plan
    check_plan_fits_columns(plan)
    if not options.dry_run:
        # Upstream's early dedupe (todos-task only): a finished or running task needs no lock.
        early = _early_dedupe(plan, now) if plan.route_key == TODOS_TASK else None
        if early is not None:
            return early
        with transaction.atomic():
            admission_lock()
            return _admit(plan, now=now, dry_run=False, enqueue=enqueue)
    try:
        with transaction.atomic():
            admission_lock()
            result = _admit(plan, now=now, dry_run=True)
            raise _DryRunRollback(result)
    except _DryRunRollback as rollback:
        return rollback.result
