"""Stage 1 of admission, the plan (no store access): validate the envelope, check
eligibility, resolve the project path, group, route scope, idempotency key, names,
template and the render-time account per role. Bad input raises ValidationError.

What a plan needs of the store, its caller reads (`plan_reads`, `PlanReads`: the hosts'
roots and the account registry) and passes in; the plan reads the file system (the project
path) and writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.db import models

from domain.controls import control_refused
from domain.errors import ValidationError
from domain.events import (
    Envelope,
    parse_envelope,
    project_group_hint,
)
from domain.keys import (
    TODOS_TASK,
    generic_names,
    route_key_for_kind,
    todos_task_names,
)
from domain.retry import DEFAULT_MAX_ATTEMPTS, DEFAULT_RETRY_BACKOFF_SECONDS
from domain.sandbox import (
    WORKTREE_REQUIRED,
    sandbox_preflight,
    worktree_enabled,
)
from domain.scope import resolve_route_scope
from domain.templates import (
    pool_roles_by_step,
    render_workflow,
    roles_for_template,
    step_account,
    template_for,
)
from domain.throttle import (
    ThrottleLimits,
)
from domain.windows import MaxWindowUsed
from ledger.hosts import HostsSnapshot, admission_provider_refusal, hosts_snapshot
from ledger.models import (
    Loop,
    WorkflowInvocation,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.selectors import registered_providers
from routing.admission.event_view import EventView, event_view, invocation_fields
from routing.admission.options import (
    RouteOptions,
    route_options,
    route_provider,
)
from routing.admission.results import RouteResult
from routing.admission.route_accounts import RouteAccounts, route_accounts
from runs.projects import (
    REQUIRED_NOT_GIT,
    WorktreeRequired,
    project_path_admit,
)
from runs.sandbox import admission_sandbox_problem

# --- stage 1: the plan (no store access) ------------------------------------------------------


def normalize_project_path(path: str, *, cwd: str) -> str:
    """Absolute, symlinks resolved, and the git work tree's top level when inside one.

    For drain filters (`--project-path-prefix`), not for admission: a route's project goes
    through `runs.projects.project_path_resolve`, which also enforces the project roots.
    Walks up looking for `.git` instead of running git; no `~` expansion.
    """
    resolved = os.path.abspath(os.path.join(cwd, path))
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
    sandbox_preflight: tuple[dict[str, str], ...] = ()
    # Loop-level retries stored on the admitted one-shot loop (max_attempts, retry_delay_ms).
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_delay_ms: int = DEFAULT_RETRY_BACKOFF_SECONDS * 1000
    # Why this route is refused unless admission dedupes it first (docs/upstream.md §3.2.10:
    # `--worktree-mode required` on a path that is not a git work tree).
    refusal: str | None = None
    # The todos task as results report it (id, title, description, tags, project path).
    task: dict[str, Any] | None = None
    # What the item stores of this decision (`route_options_json`), for a retry to re-admit
    # it with the same route: `stored_route`.
    route: dict[str, Any] | None = None
    # Planned from an item's stored route by an operator's retry (`plan_stored_route`): a
    # retry the caps defer keeps that route for whichever drain admits it later.
    retry: bool = False
    # --max-window-used (None: domain.windows.DEFAULT_MAX_WINDOW_USED; off: domain/windows.py,
    # "windows off").
    max_window_used: MaxWindowUsed | None = None
    # The PR review gate's reading (routing.admission.review_gate), when it applied.
    pr_review_routing: dict[str, Any] | None = None

    def result_extra(self) -> dict[str, Any] | None:
        """What a result of this plan adds to upstream's fields: `prReviewRouting`."""
        if self.pr_review_routing is None:
            return None
        return {"prReviewRouting": self.pr_review_routing}


def stored_route(
    kind: str, envelope: Envelope, options: RouteOptions, *, scope: str
) -> dict[str, Any]:
    """The route of one admission decision as the item stores it: the route kind, the
    options (the scope as resolved, so a scheduled drain's scope survives the retry; never
    dry-run) and the event envelope as delivered."""
    event = dict(envelope.raw) or {
        "id": envelope.id,
        "type": envelope.type,
        "source": envelope.source,
        **({"subject": envelope.subject} if envelope.subject is not None else {}),
        **({"time": envelope.time} if envelope.time is not None else {}),
        "data": envelope.data,
        "metadata": envelope.metadata,
    }
    stored = replace(options, dry_run=False, max_active_scope=scope)
    return {"kind": kind, "options": stored.to_dict(), "event": event}


def retry_pending(item: WorkflowWorkItem) -> bool:
    """Whether `item` waits (queued or deferred) after a retry the caps deferred: the
    admission that takes it next uses its stored route, not the caller's options."""
    route = item.route_options_json
    return (
        item.status in (WorkItemStatus.QUEUED, WorkItemStatus.DEFERRED)
        and isinstance(route, dict)
        and route.get("retry") is True
    )


@dataclass(frozen=True)
class PlanReads:
    """What a plan knows of the store, read by its caller (a drain: once per pass), so the
    plan reads no table and writes none: the hosts and the account registry (account ->
    provider; None where the caller does not consult it)."""

    hosts: HostsSnapshot
    registered: Mapping[str, str] | None = None


def plan_reads(*, accounts: bool = True) -> PlanReads:
    """The store's answers a plan needs, read now (`accounts`: the registry too)."""
    return PlanReads(hosts_snapshot(), registered_providers() if accounts else None)


def plan_stored_route(
    route: Mapping[str, Any], *, reads: PlanReads
) -> RoutePlan | RouteResult:
    """The plan of an item's stored route (`stored_route`), for a retry: its event with its
    options, as the first admission planned it (bad input raises as `plan_route`)."""
    event = route.get("event")
    options = route.get("options")
    if not isinstance(event, dict) or not isinstance(options, dict):
        raise ValidationError("the stored route is incomplete: no event or options")
    plan = plan_route(
        kind=str(route.get("kind") or ""),
        envelope=parse_envelope(event),
        options=route_options(options),
        env={},  # the stored options name the scope the first admission resolved
        reads=reads,
    )
    return plan if isinstance(plan, RouteResult) else replace(plan, retry=True)


def plan_route(
    *,
    kind: str,
    envelope: Envelope,
    options: RouteOptions,
    env: Mapping[str, str],
    cwd: str | None = None,
    reads: PlanReads,
) -> RoutePlan | RouteResult:
    """Everything decidable without the store (what it needs of it, `reads`, its caller
    read); a RouteResult when the event is skipped. It reads the file system (the project
    path) and writes nothing.

    Isolation is decided here, so every entry point (command, drain, API) refuses the same
    routes before any write: the project path must resolve inside LOOPSWEB_PROJECT_ROOTS,
    `--worktree-mode required` needs a git work tree, and every agent step must pass the
    sandbox preflight (docs/upstream.md §3.3); every value the plan would write must fit its ledger
    column (`check_plan_fits_columns`, checked here once). `cwd` is accepted for the callers' sake but never
    used as a project path: upstream's fallback to the process directory would run an
    event's agent wherever the routing process happens to sit.

    `reads.registered` (account name -> provider) decides whether a non-codewith pool is
    routed (domain/templates.py, "pool routing"); `reads.hosts` holds the roots a project is
    admitted under.
    """
    route_key = route_key_for_kind(kind)
    template_id = template_for(route_key, options.template)
    view = event_view(route_key, envelope, options)
    if isinstance(view, RouteResult):
        return view  # an ineligible todos task: skipped
    project_path, git_work_tree = _project_admit(view.raw_path, reads.hosts)
    project_group = project_group_hint(
        envelope.data, envelope.metadata, option=options.project_group
    )
    scope = resolve_route_scope(
        explicit=options.max_active_scope, env=env, route_key=route_key
    )
    roles = roles_for_template(template_id)
    accounts = route_accounts(
        envelope, options, roles=roles, seed=view.seed, registered=reads.registered
    )
    spec, preflight = _render(
        view,
        options,
        accounts,
        template_id=template_id,
        project_path=project_path,
        git_work_tree=git_work_tree,
    )
    plan = _assemble(
        kind,
        view,
        options,
        accounts,
        _Rendered(template_id, roles, spec, tuple(preflight)),
        project_path=project_path,
        project_group=project_group,
        git_work_tree=git_work_tree,
        scope=scope,
    )
    check_plan_fits_columns(plan)  # bad input never reaches the admission lock
    return plan


@dataclass(frozen=True)
class _Rendered:
    template_id: str
    roles: tuple[str, ...]
    spec: dict[str, Any]
    preflight: tuple[dict[str, str], ...]


def _assemble(
    kind: str,
    view: EventView,
    options: RouteOptions,
    accounts: RouteAccounts,
    rendered: _Rendered,
    *,
    project_path: str,
    project_group: str | None,
    git_work_tree: bool,
    scope: str,
) -> RoutePlan:
    """The plan from its stages' results, with the invocation's fields."""
    envelope = view.envelope
    template_id = rendered.template_id
    fields = invocation_fields(
        view,
        template_id=template_id,
        project_path=project_path,
        project_group=project_group,
        scope=scope,
        options=options,
        accounts=accounts,
    )
    return RoutePlan(
        route_key=view.route_key,
        envelope=envelope,
        task_id=view.task_id,
        idempotency_key=view.key,
        subject_ref=view.subject_ref,
        project_path=project_path,
        project_group=project_group,
        scope=scope,
        limits=options.limits,
        template_id=template_id,
        roles=rendered.roles,
        provider=accounts.provider,
        pool=accounts.pool,
        pool_active=accounts.pool_active,
        max_per_profile=accounts.max_per_profile,
        seed=view.seed,
        workflow_name=view.workflow_name,
        loop_name=view.loop_name,
        spec=rendered.spec,
        invocation_fields=fields,
        sandbox_preflight=rendered.preflight,
        max_attempts=options.max_attempts or DEFAULT_MAX_ATTEMPTS,
        retry_delay_ms=1000
        * (
            options.retry_backoff
            if options.retry_backoff is not None
            else DEFAULT_RETRY_BACKOFF_SECONDS
        ),
        # docs/upstream.md §3.2.10: the worktree check comes after the early dedupe, so the
        # plan only records it; admission raises it once the lookup found nothing to
        # dedupe (`transaction.admit`).
        refusal=(
            REQUIRED_NOT_GIT.format(path=project_path)
            if options.worktree_mode == WORKTREE_REQUIRED and not git_work_tree
            else None
        ),
        task=view.task(project_path),
        route=stored_route(kind, envelope, options, scope=scope),
        max_window_used=options.max_window_used,
        pr_review_routing=view.pr_review_routing,
    )


def _project_admit(raw_path: str | None, hosts: HostsSnapshot) -> tuple[str, bool]:
    """The route's project (inside LOOPSWEB_PROJECT_ROOTS, or the hosts' roots) and
    whether it is a git work tree; refused before anything is written, and never the
    directory of the process that routes (no cwd fallback)."""
    if raw_path is not None and _utf8_size(raw_path) > MAX_INDEX_ENTRY_BYTES:
        # Refused before the file system is asked (a path that long is no directory anyway).
        raise ValidationError(
            INDEX_ENTRY_TOO_LONG.format(
                what="project path",
                size=_utf8_size(raw_path),
                limit=MAX_INDEX_ENTRY_BYTES,
            )
        )
    return project_path_admit(raw_path, hosts)


def _render(
    view: EventView,
    options: RouteOptions,
    accounts: RouteAccounts,
    *,
    template_id: str,
    project_path: str,
    git_work_tree: bool,
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The workflow spec of the route and its sandbox preflight (docs/upstream.md §3.3)."""
    spec = render_workflow(
        template_id=template_id,
        provider=accounts.provider,
        title=view.title,
        description=view.body,
        project_path=project_path,
        route_key=view.route_key,
        profiles=accounts.profiles,
        sandbox=options.sandbox,
        worktree_mode=options.worktree_mode,
        manual_break_glass=options.manual_break_glass,
        step_timeout=options.step_timeout,
        step_idle_timeout=options.step_idle_timeout,
    )
    preflight = sandbox_preflight(
        spec["steps"],
        worktree=worktree_enabled(options.worktree_mode, git_work_tree=git_work_tree),
    )
    refused = admission_sandbox_problem(spec["steps"])
    if refused is not None:
        raise ValidationError(refused)
    if accounts.pool_active:
        # The runner re-checks the account's cap and windows when a step starts (no
        # stacking at start); --max-per-profile 0 (no guard) keeps --max-window-used.
        for step_id in pool_roles_by_step(spec, accounts.provider):
            for step in spec["steps"]:
                if step["id"] == step_id:
                    if accounts.guard is not None:
                        step["routing"]["maxPerProfile"] = accounts.guard
                    if options.max_window_used is not None:  # failover reads it
                        step["routing"]["maxWindowUsed"] = options.max_window_used
    return spec, preflight


def _column_limit(model: type[models.Model], name: str) -> int:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field) and field.max_length is not None
    return field.max_length


def check_plan_fits_columns(plan: RoutePlan) -> None:
    """Refuse a plan whose values overflow a ledger column, before anything is written.

    SQLite ignores varchar lengths but PostgreSQL raises mid-transaction; checking the plan
    keeps "bad input writes nothing, with a clear error" true on both (docs/design.md,
    "nothing lost, nothing half-written").
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
    _check_columns(checks)
    _check_index_rows(plan)


def _check_columns(
    checks: list[tuple[str, str | None, type[models.Model], str]],
) -> None:
    for what, value, model, column in checks:
        limit = _column_limit(model, column)
        if isinstance(value, str) and len(value) > limit:
            raise ValidationError(f"{what} is longer than {limit} characters")


def checked_route_options(
    kind: str | None, raw: Mapping[str, Any], *, env: Mapping[str, str]
) -> RouteOptions:
    """The one validation of route options every entry point runs before it reads or
    writes anything (`drain`, `schedule_drain` at creation, `route_event`, the ingest API):
    each option on its own (`route_options`), then together for `kind` (when the caller
    knows it) as a route would use them (`route_options_check`). The same bad value is the
    same error everywhere."""
    options = route_options(raw)
    if kind is not None:
        route_options_check(kind, options, env=env)
    return options


def route_options_check(
    kind: str, options: RouteOptions, *, env: Mapping[str, str]
) -> None:
    """Refuse options that would fail every event they route, before any event is read.

    A drain (and a schedule, when it is created) calls this on its options, so a bad option
    is one clear error with nothing written, never a failure recorded on each candidate:
    the template for the route, the route scope the options resolve to (`env` holds the
    loop name a scheduled drain runs under), the names the prefix makes, the project group,
    and the project path (inside LOOPSWEB_PROJECT_ROOTS, within an index entry; for a generic
    route also a git work tree under `--worktree-mode required`), each checked as
    `plan_route` checks an event's values.
    """
    route_key = route_key_for_kind(kind)
    template_for(route_key, options.template)
    scope = resolve_route_scope(
        explicit=options.max_active_scope, env=env, route_key=route_key
    )
    if route_key == TODOS_TASK:
        workflow_name, loop_name = todos_task_names(options.name_prefix, "t", "t")
    else:
        workflow_name, loop_name = generic_names(options.name_prefix, "s", "t", "i")
    refused = control_refused("route scope", scope)
    if refused:  # the loop name a scheduled drain runs under is its scope
        raise ValidationError(refused)
    checks: list[tuple[str, str | None, type[models.Model], str]] = [
        ("route scope", scope, WorkflowWorkItem, "route_scope"),
        ("project group", options.project_group, WorkflowWorkItem, "project_group"),
        ("workflow name", workflow_name, WorkflowSpec, "name"),
        ("loop name", loop_name, Loop, "name"),
    ]
    _check_columns(
        checks
    )  # account names: `route_options` already holds them to a column
    if options.project_path is not None:
        if _utf8_size(options.project_path) > MAX_INDEX_ENTRY_BYTES:
            raise ValidationError(
                INDEX_ENTRY_TOO_LONG.format(
                    what="project path",
                    size=_utf8_size(options.project_path),
                    limit=MAX_INDEX_ENTRY_BYTES,
                )
            )
        project, git_work_tree = project_path_admit(
            options.project_path, hosts_snapshot()
        )
        # A generic route's --project-path is every event's project; a todos task's is the
        # fallback of tasks that name none, and their worktree check comes after the early
        # dedupe (docs/upstream.md §3.2.9-10): a replayed task is deduped, not refused.
        required = options.worktree_mode == WORKTREE_REQUIRED
        if required and route_key != TODOS_TASK and not git_work_tree:
            raise WorktreeRequired(project)


def route_options_resolve(
    options: RouteOptions, *, registered: Mapping[str, str] | None = None
) -> RouteOptions:
    """The options with the route's provider decided (`route_provider`: from the accounts
    named when --provider is not given) and checked against the hosts: ValidationError,
    before anything is written, when the accounts belong to another provider or no host
    serves the provider (ledger.hosts.admission_provider_refusal). `registered` is the
    registry's account -> provider map (read here when None)."""
    if registered is None:
        registered = registered_providers()
    provider = route_provider(options, registered)
    refusal = admission_provider_refusal(provider)
    if refusal is not None:
        raise ValidationError(refusal)
    if provider == options.provider:
        return options
    return replace(options, provider=provider)


# PostgreSQL refuses a btree index entry over 2704 bytes (a third of a page) with an error
# that no retry can pass. Values of unbounded (text) columns that land in an index are held
# to this many UTF-8 bytes per index entry, columns summed, before anything is written.
MAX_INDEX_ENTRY_BYTES = 2600
INDEX_ENTRY_TOO_LONG = "{what} is too long: {size} bytes in UTF-8 where an index entry holds at most {limit}"


def _utf8_size(*values: object) -> int:
    return sum(
        len(value.encode("utf-8", "surrogatepass"))
        for value in values
        if isinstance(value, str)
    )


def _check_index_rows(plan: RoutePlan) -> None:
    """The indexed text columns an admission writes (see ledger.models' indexes):
    work item `project_key` (idx_workflow_work_items_project) and the invocation's
    (subject_kind, subject_id, subject_path) (idx_workflow_invocations_subject)."""
    fields = plan.invocation_fields
    entries = [
        ("project path", _utf8_size(plan.project_path)),
        (
            "project path with the subject",
            _utf8_size(
                fields.get("subject_kind"),
                fields.get("subject_id"),
                fields.get("subject_path"),
            ),
        ),
    ]
    for what, size in entries:
        if size > MAX_INDEX_ENTRY_BYTES:
            raise ValidationError(
                INDEX_ENTRY_TOO_LONG.format(
                    what=what, size=size, limit=MAX_INDEX_ENTRY_BYTES
                )
            )
