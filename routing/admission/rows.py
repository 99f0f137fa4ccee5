"""The rows an admission writes, built once for one candidate (`transaction.admit`) and for
many (`batch.admit_batch`): the event's invocation, the work item upsert
(docs/upstream.md §2.4), the spec, the loop's description, and the created result.

Nothing here decides: the caller has made the decision (`decide`) under the admission lock.
"""

from __future__ import annotations

import json
from typing import Any

from domain.pool import PoolAssignment
from domain.templates import apply_pool_profiles
from domain.throttle import AdmissionDecision
from ledger.models import (
    Loop,
    SpecStatus,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.services import join_reason
from routing.admission.plan import RoutePlan
from routing.admission.results import CREATED, RouteResult


def invocation_reuse_or_create(
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


def invocation_refresh(invocation: WorkflowInvocation, plan: RoutePlan) -> None:
    """docs/upstream.md §1.1 refresh: nullable fields take the new value when non-null, the rest overwrite."""
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


def work_item_upsert(
    *,
    existing: WorkflowWorkItem | None,
    plan: RoutePlan,
    invocation: WorkflowInvocation,
    status: str,
    reason: str | None,
    reason_code: str | None,
    save: bool,
) -> WorkflowWorkItem:
    """docs/upstream.md §2.4: insert, or update a queued/deferred row (KEEP statuses never reach here).

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
        # A retry the caps defer keeps its route for the admission that takes it later.
        "route_options_json": {**plan.route, "retry": True}
        if plan.retry and plan.route is not None and status == WorkItemStatus.DEFERRED
        else plan.route,
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
    item.unbind()
    if save:
        item.save()
    return item


def admitted_reason(plan: RoutePlan) -> str:
    return f"admitted by {plan.route_key} route"


def spec_reuse_or_create(
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


def pool_body(
    plan: RoutePlan, assignment: PoolAssignment | None
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """The workflow body with the pool's accounts applied per role, and those accounts
    (None when the pool did not assign)."""
    if assignment is None or not assignment.profiles:
        return plan.spec, None
    profiles = dict(assignment.profiles)
    return apply_pool_profiles(plan.spec, profiles, plan.provider), profiles


def created_result(
    plan: RoutePlan,
    *,
    item: WorkflowWorkItem,
    invocation: WorkflowInvocation,
    spec: WorkflowSpec,
    loop: Loop,
    run: WorkflowRun,
    decision: AdmissionDecision | None,
    account_profiles: dict[str, str] | None,
    requeue: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> RouteResult:
    """The result of an admission that created a run."""
    return RouteResult(
        kind=CREATED,
        idempotency_key=plan.idempotency_key,
        event=plan.envelope,
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
        task=plan.task,
        extra=plan.result_extra(),
    )
