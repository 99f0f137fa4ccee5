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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from ledger.models import (
    KEEP_WORK_ITEM_STATUSES,
    Loop,
    SpecStatus,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemDeferral,
    WorkItemStatus,
)
from ledger.selectors import account_state, active_counts, admission_rows
from ledger.services import join_reason, work_item_admit
from ledger.tasks import enqueue_run_workflow
from routing.domain import reasons
from routing.domain.eligibility import task_route_eligibility, todos_task_id
from routing.domain.errors import ValidationError
from routing.domain.events import (
    Envelope,
    first_string,
    generic_project_path_hint,
    load_envelope,
    parse_envelope,
    project_group_hint,
    task_field,
    todos_project_path_hint,
)
from routing.domain.keys import (
    TODOS_TASK,
    generic_event_key,
    generic_names,
    generic_pool_seed,
    pr_fingerprint_from_task,
    route_key_for_kind,
    todos_task_key,
    todos_task_names,
)
from routing.domain.pool import PoolAssignment, assign_pool_auth_profiles, drop_blank
from routing.domain.readmission import readmission_decision
from routing.domain.scope import resolve_route_scope
from routing.domain.templates import (
    apply_pool_profiles,
    parse_pool,
    pool_roles_by_step,
    pool_routing_active,
    render_workflow,
    resolve_role_profiles,
    roles_for_template,
    step_account,
    template_for,
)
from routing.domain.throttle import (
    AdmissionDecision,
    ThrottleCounts,
    ThrottleLimits,
    admission_decision,
    parse_limit,
    pool_deferral_decision,
)
from routing.lock import admission_lock

ROLES = ("triage", "planner", "worker", "verifier")
POOL_METADATA_KEYS = (
    "auth_profile_pool",
    "authProfilePool",
    "codewith_profile_pool",
    "codewithProfilePool",
    "profile_pool",
    "profilePool",
)
DEFAULT_MAX_PER_PROFILE = 2
PUBLIC_REASON_CHARS = 240

CREATED, DEDUPED, THROTTLED, SKIPPED = "created", "deduped", "throttled", "skipped"


# --- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteOptions:
    """The upstream `routes create` options (validated; see `route_options`)."""

    template: str | None = None
    provider: str = "codewith"
    auth_profile: str | None = None
    auth_profile_pool: tuple[str, ...] = ()
    pins: Mapping[str, str | None] = field(default_factory=dict)
    max_active: int | None = None
    max_active_scope: str | None = None
    max_active_per_project: int | None = None
    max_active_per_project_group: int | None = None
    project_group: str | None = None
    project_path: str | None = None
    max_per_profile: int | None = None
    name_prefix: str | None = None
    dry_run: bool = False

    @property
    def limits(self) -> ThrottleLimits:
        return ThrottleLimits(
            max_active=self.max_active,
            max_active_per_project=self.max_active_per_project,
            max_active_per_project_group=self.max_active_per_project_group,
        )

    def to_dict(self) -> dict[str, Any]:
        """The options as plain JSON (drain records, schedules)."""
        out: dict[str, Any] = {}
        for name in OPTION_NAMES:
            value = (
                getattr(self, name)
                if name not in PIN_OPTIONS
                else self.pins.get(PIN_OPTIONS[name])
            )
            if name == "auth_profile_pool":
                value = ",".join(value) if value else None
            if value not in (None, False, ""):
                out[name] = value
        return out


PIN_OPTIONS = {
    "triage_auth_profile": "triage",
    "planner_auth_profile": "planner",
    "worker_auth_profile": "worker",
    "verifier_auth_profile": "verifier",
}
OPTION_NAMES = (
    "template",
    "provider",
    "auth_profile",
    "auth_profile_pool",
    *PIN_OPTIONS,
    "max_active",
    "max_active_scope",
    "max_active_per_project",
    "max_active_per_project_group",
    "project_group",
    "project_path",
    "max_per_profile",
    "name_prefix",
    "dry_run",
)
PROVIDERS = ("codewith", "claude", "codex", "cursor", "opencode", "aicopilot")


def _text(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"--{name.replace('_', '-')} must be a string")
    return value.strip() or None


def route_options(raw: Mapping[str, Any]) -> RouteOptions:
    """Validate option values (from argv, a schedule or an API body) into RouteOptions.

    Unknown keys are refused, so a typo never silently drops a cap.
    """
    unknown = sorted(set(raw) - set(OPTION_NAMES))
    if unknown:
        raise ValidationError(f"unknown route option: {unknown[0]}")
    provider = _text("provider", raw.get("provider")) or "codewith"
    if provider not in PROVIDERS:
        raise ValidationError(f"--provider must be one of {', '.join(PROVIDERS)}")
    pool_raw = raw.get("auth_profile_pool")
    if isinstance(pool_raw, (list, tuple)):
        pool = tuple(drop_blank([str(p) for p in pool_raw]))
    else:
        pool = tuple(parse_pool(_text("auth_profile_pool", pool_raw)))
    dry_run = raw.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ValidationError("--dry-run must be a boolean")
    return RouteOptions(
        template=_text("template", raw.get("template")),
        provider=provider,
        auth_profile=_text("auth_profile", raw.get("auth_profile")),
        auth_profile_pool=pool,
        pins={role: _text(flag, raw.get(flag)) for flag, role in PIN_OPTIONS.items()},
        max_active=parse_limit("--max-active", raw.get("max_active")),
        max_active_scope=_text("max_active_scope", raw.get("max_active_scope")),
        max_active_per_project=parse_limit(
            "--max-active-per-project", raw.get("max_active_per_project")
        ),
        max_active_per_project_group=parse_limit(
            "--max-active-per-project-group", raw.get("max_active_per_project_group")
        ),
        project_group=_text("project_group", raw.get("project_group")),
        project_path=_text("project_path", raw.get("project_path")),
        max_per_profile=parse_limit(
            "--max-per-profile", raw.get("max_per_profile"), allow_zero=True
        ),
        name_prefix=_text("name_prefix", raw.get("name_prefix")),
        dry_run=dry_run,
    )


# --- stage 1: the plan (no store access) ------------------------------------------------------


def normalize_project_path(path: str, *, cwd: str) -> str:
    """Absolute, symlinks resolved, and the git work tree's top level when inside one.

    Walks up looking for `.git` instead of running git: no subprocess per admission, and no
    event value anywhere near a command line.
    """
    resolved = os.path.abspath(os.path.join(cwd, os.path.expanduser(path)))
    try:
        real = os.path.realpath(resolved, strict=True)
    except OSError:
        return resolved
    for candidate in (Path(real), *Path(real).parents):
        if (candidate / ".git").exists():
            return str(candidate)
    return real


@dataclass(frozen=True)
class RoutePlan:
    route_key: str
    envelope: Envelope
    task_id: str | None
    idempotency_key: str
    subject_ref: str
    project_path: str
    project_group: str | None
    scope: str
    limits: ThrottleLimits
    template_id: str
    roles: tuple[str, ...]
    provider: str
    pool: tuple[str, ...]
    pool_active: bool
    max_per_profile: int | None
    seed: str
    workflow_name: str
    loop_name: str
    spec: dict[str, Any]
    invocation_fields: dict[str, Any]


@dataclass
class RouteResult:
    kind: str
    idempotency_key: str | None
    event: Envelope
    reason: str | None = None
    reason_code: str | None = None
    work_item: WorkflowWorkItem | None = None
    invocation: WorkflowInvocation | None = None
    workflow: WorkflowSpec | None = None
    loop: Loop | None = None
    run: WorkflowRun | None = None
    throttle: AdmissionDecision | None = None
    account_profiles: dict[str, str] | None = None
    route_scope: str | None = None
    requeue: dict[str, Any] | None = None
    eligibility: dict[str, Any] | None = None
    task_id: str | None = None
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "dryRun": self.dry_run}
        if self.idempotency_key:
            out["idempotencyKey"] = self.idempotency_key
        if self.reason:
            out["reason"] = self.reason
        if self.reason_code:
            out["reasonCode"] = self.reason_code
        out["event"] = {
            "id": self.event.id,
            "type": self.event.type,
            "source": self.event.source,
        }
        if self.task_id:
            out["taskId"] = self.task_id
        if self.eligibility is not None:
            out["eligibility"] = self.eligibility
        if self.work_item is not None:
            out["workItem"] = work_item_to_dict(self.work_item)
        if self.invocation is not None:
            out["invocation"] = {"id": self.invocation.id}
        if self.workflow is not None:
            out["workflow"] = {"id": self.workflow.id, "name": self.workflow.name}
        if self.loop is not None:
            out["loop"] = {"id": self.loop.id, "name": self.loop.name}
        if self.run is not None:
            out["run"] = {"id": self.run.id, "status": self.run.status}
        if self.account_profiles:
            out["accountProfiles"] = self.account_profiles
            out["routeScope"] = self.route_scope
        if self.throttle is not None:
            out["throttle"] = self.throttle.to_dict()
        if self.requeue is not None:
            out["requeue"] = self.requeue
        return out

    def human(self) -> str:
        """The upstream one-line summary (§3.8)."""
        noun = f"task {self.task_id}" if self.task_id else f"event {self.event.id}"
        if self.kind == CREATED and self.loop is not None and self.workflow is not None:
            prefix = "dry-run " if self.dry_run else ""
            return (
                f"{prefix}created {self.loop.id} ({self.loop.name}) workflow={self.workflow.name} "
                f"event={self.event.id} idempotency={self.idempotency_key}"
            )
        if self.kind == DEDUPED and self.work_item is not None:
            return (
                f"deduped existing work item {self.work_item.id} for event={self.event.id} "
                f"idempotency={self.idempotency_key}"
            )
        return f"skipped {noun}: {self.reason}"


def work_item_to_dict(item: WorkflowWorkItem) -> dict[str, Any]:
    reason = item.last_reason
    if reason and len(reason) > PUBLIC_REASON_CHARS:
        reason = reason[: PUBLIC_REASON_CHARS - 1] + "…"
    return {
        "id": item.id,
        "routeKey": item.route_key,
        "idempotencyKey": item.idempotency_key,
        "status": item.status,
        "attempts": item.attempts,
        "routeScope": item.route_scope,
        "projectKey": item.project_key,
        "projectGroup": item.project_group,
        "lastReason": reason,
        "reasonCode": item.reason_code,
        "workflowId": item.workflow_id,
        "loopId": item.loop_id,
        "workflowRunId": item.workflow_run_id,
    }


def _event_pool(envelope: Envelope) -> list[str]:
    for record in (envelope.data, envelope.metadata):
        value = first_string(dict(record), POOL_METADATA_KEYS)
        if value:
            return parse_pool(value)
        for key in POOL_METADATA_KEYS:
            if isinstance(record.get(key), list):
                return drop_blank([str(p) for p in record[key]])
    return []


def plan_route(
    *,
    kind: str,
    envelope: Envelope,
    options: RouteOptions,
    env: Mapping[str, str],
    cwd: str,
) -> RoutePlan | RouteResult:
    """Everything decidable without the store; a RouteResult when the event is skipped."""
    route_key = route_key_for_kind(kind)
    template_id = template_for(route_key, options.template)
    data, metadata = envelope.data, envelope.metadata
    task_id: str | None = None
    if route_key == TODOS_TASK:
        task_id = todos_task_id(data)
        eligibility = task_route_eligibility(data, metadata)
        if not eligibility.eligible:
            return RouteResult(
                kind=SKIPPED,
                idempotency_key=None,
                event=envelope,
                reason=eligibility.reason,
                task_id=task_id,
                eligibility=eligibility.to_dict(),
                dry_run=options.dry_run,
            )
        raw_path = todos_project_path_hint(
            data, metadata, option=options.project_path, cwd=cwd
        )
        key = todos_task_key(task_id, pr_fingerprint=pr_fingerprint_from_task(data))
        workflow_name, loop_name = todos_task_names(options.name_prefix, task_id, key)
        seed = task_id
        subject_ref = task_id
        title = task_field(data, "title")
        body = task_field(data, "description")
    else:
        raw_path = generic_project_path_hint(
            data, metadata, option=options.project_path, cwd=cwd
        )
        key = generic_event_key(envelope.source, envelope.type, envelope.id)
        workflow_name, loop_name = generic_names(
            options.name_prefix, envelope.source, envelope.type, envelope.id
        )
        seed = generic_pool_seed(envelope.source, envelope.type, envelope.id)
        subject_ref = envelope.subject or envelope.id
        title = first_string(dict(data), ("title", "summary"))
        body = first_string(dict(data), ("message", "description", "body"))

    project_path = normalize_project_path(raw_path, cwd=cwd)
    project_group = project_group_hint(data, metadata, option=options.project_group)
    scope = resolve_route_scope(
        explicit=options.max_active_scope, env=env, route_key=route_key
    )
    roles = roles_for_template(template_id)
    pool = list(options.auth_profile_pool) or (
        [] if options.auth_profile else _event_pool(envelope)
    )
    pins = {role: options.pins.get(role) for role in ROLES}
    pool_active = pool_routing_active(provider=options.provider, pool=pool, pins=pins)
    max_per_profile = options.max_per_profile
    if pool_active and max_per_profile is None:
        max_per_profile = DEFAULT_MAX_PER_PROFILE
    profiles = resolve_role_profiles(
        roles=roles, pool=pool, seed=seed, auth_profile=options.auth_profile, pins=pins
    )
    spec = render_workflow(
        template_id=template_id,
        provider=options.provider,
        title=title,
        description=body,
        project_path=project_path,
        route_key=route_key,
        profiles=profiles,
    )
    if pool_active and max_per_profile:
        # The runner re-checks the account's cap when a step starts (no stacking at start).
        for step_id in pool_roles_by_step(spec):
            for step in spec["steps"]:
                if step["id"] == step_id:
                    step["routing"]["maxPerProfile"] = max_per_profile

    account_policy = (
        "role-explicit" if any(pins.values()) else ("pool" if pool else "single")
    )
    if route_key == TODOS_TASK:
        subject = {
            "kind": "task",
            "id": task_id,
            "path": project_path,
            "raw": {"title": title, "description": body},
        }
        raw_source = {
            "type": envelope.type,
            "source": envelope.source,
            "subject": envelope.subject,
        }
    else:
        subject = {
            "kind": "event",
            "id": subject_ref,
            "path": project_path,
            "raw": {"message": body},
        }
        raw_source = {"source": envelope.source, "type": envelope.type}
    invocation_fields = {
        "template_id": template_id,
        "source_id": envelope.id,
        "source_json": {
            "kind": "event",
            "id": envelope.id,
            "dedupeKey": key,
            "raw": raw_source,
        },
        "subject_kind": subject["kind"],
        "subject_id": subject["id"],
        "subject_path": project_path,
        "subject_json": subject,
        "intent": "route",
        "scope_json": {
            "projectPath": project_path,
            "projectGroup": project_group,
            "worktreePolicy": "auto",
            "permissions": "bypass",
            "manualBreakGlass": False,
            "accountPolicy": account_policy,
            "providerRouting": {
                "provider": options.provider,
                "pool": pool,
                "poolRouting": pool_active,
            },
            "concurrencyGroup": project_group or project_path,
            "routeScope": scope,
            "routeThrottle": {
                **options.limits.to_dict(),
                "maxPerProfile": max_per_profile,
            },
        },
        "output_policy_json": {"report": "always", "createTask": "on_failure"},
    }
    return RoutePlan(
        route_key=route_key,
        envelope=envelope,
        task_id=task_id,
        idempotency_key=key,
        subject_ref=subject_ref,
        project_path=project_path,
        project_group=project_group,
        scope=scope,
        limits=options.limits,
        template_id=template_id,
        roles=roles,
        provider=options.provider,
        pool=tuple(pool),
        pool_active=pool_active,
        max_per_profile=max_per_profile,
        seed=seed,
        workflow_name=workflow_name,
        loop_name=loop_name,
        spec=spec,
        invocation_fields=invocation_fields,
    )


def _column_limit(model: type[models.Model], name: str) -> int:
    limit = model._meta.get_field(name).max_length
    assert limit is not None
    return limit


def check_plan_fits_columns(plan: RoutePlan) -> None:
    """Refuse a plan whose values overflow a ledger column, before anything is written.

    SQLite ignores varchar lengths but PostgreSQL raises mid-transaction; checking the plan
    keeps "bad input writes nothing, with a clear error" true on both (DESIGN rule 4).
    """
    checks: list[tuple[str, str | None, type[models.Model], str]] = [
        ("idempotency key", plan.idempotency_key, WorkflowWorkItem, "idempotency_key"),
        ("event.id", plan.envelope.id, WorkflowWorkItem, "source_ref"),
        ("event.type", plan.envelope.type, WorkflowWorkItem, "source_type"),
        ("subject", plan.subject_ref, WorkflowWorkItem, "subject_ref"),
        ("project group", plan.project_group, WorkflowWorkItem, "project_group"),
        ("route scope", plan.scope, WorkflowWorkItem, "route_scope"),
        ("workflow name", plan.workflow_name, WorkflowSpec, "name"),
        ("loop name", plan.loop_name, Loop, "name"),
        (
            "subject id",
            plan.invocation_fields.get("subject_id"),
            WorkflowInvocation,
            "subject_id",
        ),
    ]
    checks += [
        ("pool account", member, WorkflowStepRun, "account_profile")
        for member in plan.pool
    ]
    for step in plan.spec.get("steps") or []:
        profile, tool = step_account(step)
        checks.append(("step account", profile, WorkflowStepRun, "account_profile"))
        checks.append(("step tool", tool, WorkflowStepRun, "account_tool"))
        checks.append(("step id", step.get("id"), WorkflowStepRun, "step_id"))
    for what, value, model, column in checks:
        limit = _column_limit(model, column)
        if isinstance(value, str) and len(value) > limit:
            raise ValidationError(f"{what} is longer than {limit} characters")


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
    created = WorkflowInvocation.objects.create(
        source_kind="event",
        source_dedupe_key=plan.idempotency_key,
        **plan.invocation_fields,
    )
    return created, True


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
    noun = f"task {plan.task_id}" if plan.task_id else f"event {plan.envelope.id}"
    return WorkflowSpec.objects.create(
        name=plan.workflow_name,
        description=f"{plan.template_id} for {noun}",
        version=version,
        goal_json=goal,
        steps_json=steps,
    )


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
    members_cooling = {p: until for p, until in state.cooling.items() if p in plan.pool}
    loads = state.load.total()
    assignment = assign_pool_auth_profiles(
        list(plan.pool),
        loads,
        plan.seed,
        list(plan.roles),
        plan.max_per_profile,
        cooling=tuple(members_cooling),
    )
    return PoolView(assignment=assignment, loads=loads, cooling=members_cooling)


def _admit(plan: RoutePlan, *, now: datetime, dry_run: bool) -> RouteResult:
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
        body = apply_pool_profiles(plan.spec, assignment.profiles)
        account_profiles = dict(assignment.profiles)
    spec = _spec_reuse_or_create(plan, body, found.spec_id)
    noun = f"task {plan.task_id}" if plan.task_id else f"event {envelope.id}"
    loop, run = work_item_admit(
        item=item,
        spec=spec,
        invocation=invocation,
        loop_name=plan.loop_name,
        loop_description=f"Run {spec.name} once for {noun}; idempotency={plan.idempotency_key}"
        + (f"; event={envelope.id}" if plan.task_id else ""),
        reason=f"admitted by {plan.route_key} route",
        now=now,
    )
    if requeue is not None:
        requeue = {
            **requeue,
            "attempt": item.attempts,
            "newWorkflowId": spec.id,
            "newLoopId": loop.id,
        }
    if not dry_run:
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
) -> RouteResult:
    """Route one event envelope (a dict, a parsed Envelope, or JSON text).

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
            return _admit(plan, now=now, dry_run=False)
    try:
        with transaction.atomic():
            admission_lock()
            result = _admit(plan, now=now, dry_run=True)
            raise _DryRunRollback(result)
    except _DryRunRollback as rollback:
        return rollback.result
