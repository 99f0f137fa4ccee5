"""Generated route workflow templates and per-role auth profiles (docs/upstream.md §2.3, §3.2.12, §4.5).

Contract:
1. Templates: ``todos-task-worker-verifier`` (worker, verifier) and ``task-lifecycle``
   (triage, planner, worker, verifier) for todos-task routes; ``event-worker-verifier``
   (worker, verifier) for generic routes. Each step depends on the one before it.
2. ``render_workflow`` returns a JSON-serialisable spec body. Prompts are plain text
   built from the event's title and description, each fenced as data
   (domain.revisions.untrusted_section); they are handed to agents as argv items or
   files, never through a shell (docs/design.md, "no shell between loopsweb and an
   agent"), so nothing is shell-escaped.
3. Render-time profile per role: an explicit role pin, else the pool's hash pick
   (a single-member pool always gives that member), else ``--auth-profile``.
4. Pool routing (least-loaded assignment at admission) is active for provider
   ``codewith`` (upstream), and (loopsweb) for any other provider when every pool member
   is a registered account of that provider (``registered``: name -> provider), in both
   cases with at least two non-blank pool members and no role pinned. Every generated
   template has agent steps of the route's provider, so the fourth upstream condition
   reduces to the provider check.
5. ``step_account`` gives the (account_profile, account_tool) a step run records.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from domain.errors import (
    ROUTE_KEY_INVALID,
    TEMPLATE_INVALID_GENERIC,
    TEMPLATE_INVALID_TODOS,
    ValidationError,
)
from domain.keys import GENERIC_EVENT, TODOS_TASK
from domain.pool import drop_blank, render_time_profile
from domain.revisions import untrusted_section
from domain.sandbox import (
    DEFAULT_SANDBOX,
    DEFAULT_WORKTREE_MODE,
    break_glass_allowlist,
)

TODOS_TASK_WORKER_VERIFIER = "todos-task-worker-verifier"
TASK_LIFECYCLE = "task-lifecycle"
EVENT_WORKER_VERIFIER = "event-worker-verifier"

TEMPLATE_ROLES: dict[str, tuple[str, ...]] = {
    TODOS_TASK_WORKER_VERIFIER: ("worker", "verifier"),
    TASK_LIFECYCLE: ("triage", "planner", "worker", "verifier"),
    EVENT_WORKER_VERIFIER: ("worker", "verifier"),
}
TEMPLATES_BY_ROUTE_KEY: dict[str, tuple[str, ...]] = {
    TODOS_TASK: (TODOS_TASK_WORKER_VERIFIER, TASK_LIFECYCLE),
    GENERIC_EVENT: (EVENT_WORKER_VERIFIER,),
}
GENERATED_TEMPLATES: frozenset[str] = frozenset(TEMPLATE_ROLES)

POOL_PROVIDER = "codewith"
# The provider of a route, drain or schedule that names none (--provider).
DEFAULT_PROVIDER = "codewith"

WORKER = "worker"
VERIFIER = "verifier"

ROLE_INSTRUCTIONS: dict[str, str] = {
    "triage": (
        "Triage this {noun}: confirm it is still actionable and clear enough to act on "
        "in this repository. Report what is missing instead of guessing. "
        "Do not edit files."
    ),
    "planner": (
        "Plan the change for this {noun}: the files to touch, the approach, and the "
        "checks that will prove it works. Do not edit files."
    ),
    "worker": (
        "Carry out this {noun} in the repository. Keep the change focused, run the "
        "relevant checks, and summarise what you changed."
    ),
    "verifier": (
        "Verify the work done for this {noun}: review the change, run the relevant "
        "checks, and report whether it is complete. Do not rewrite the change. End your "
        "final message with one verdict line: `VERDICT: approve` when the work is "
        "complete; `VERDICT: changes` followed by your findings (what is wrong or "
        "missing, with file paths) when the work should be revised; or `VERDICT: "
        "escalate` followed by why, when only a human can decide."
    ),
}


def template_for(route_key: str, template_arg: str | None) -> str:
    """The template id for a route, validating ``--template`` (blank means default)."""
    choice = template_arg.strip() if template_arg else ""
    if route_key == TODOS_TASK:
        if not choice:
            return TODOS_TASK_WORKER_VERIFIER
        if choice in TEMPLATES_BY_ROUTE_KEY[TODOS_TASK]:
            return choice
        raise ValidationError(TEMPLATE_INVALID_TODOS)
    if route_key == GENERIC_EVENT:
        if not choice or choice == EVENT_WORKER_VERIFIER:
            return EVENT_WORKER_VERIFIER
        raise ValidationError(TEMPLATE_INVALID_GENERIC)
    raise ValidationError(ROUTE_KEY_INVALID.format(route_key=route_key))


def roles_for_template(template_id: str) -> tuple[str, ...]:
    try:
        return TEMPLATE_ROLES[template_id]
    except KeyError:
        raise ValidationError(f"unknown workflow template: {template_id}") from None


def _pin(pins: Mapping[str, str | None], role: str) -> str | None:
    value = pins.get(role)
    return value.strip() if value and value.strip() else None


def pool_routing_active(
    *,
    provider: str,
    pool: Sequence[str],
    pins: Mapping[str, str | None],
    registered: Mapping[str, str] | None = None,
) -> bool:
    members = drop_blank(pool)
    if len(members) < 2:
        return False
    if provider != POOL_PROVIDER and not all(
        (registered or {}).get(member.strip()) == provider for member in members
    ):
        return False
    # Explicit pins are honoured verbatim, so any pin switches pool routing off for
    # every role (upstream behaviour), not only for the pinned one.
    return not any(_pin(pins, role) for role in pins)


def resolve_role_profiles(
    *,
    roles: Sequence[str],
    pool: Sequence[str],
    seed: str,
    auth_profile: str | None,
    pins: Mapping[str, str | None],
) -> dict[str, str | None]:
    fallback = auth_profile.strip() if auth_profile and auth_profile.strip() else None
    profiles: dict[str, str | None] = {}
    for role in roles:
        profiles[role] = (
            _pin(pins, role) or render_time_profile(pool, seed, role) or fallback
        )
    return profiles


def _prompt(
    *,
    role: str,
    noun: str,
    title: str | None,
    body: str | None,
    project_path: str,
    route_key: str,
) -> str:
    instruction = ROLE_INSTRUCTIONS.get(role, ROLE_INSTRUCTIONS["worker"])
    lines = [
        instruction.format(noun=noun),
        "",
        f"Route: {route_key}",
        f"Project: {project_path}",
    ]
    if title and title.strip():
        lines += ["", *untrusted_section("Title", f"the {noun}'s author", title)]
    if body and body.strip():
        lines += ["", *untrusted_section("Details", f"the {noun}'s author", body)]
    return "\n".join(lines)


def render_workflow(
    *,
    template_id: str,
    provider: str,
    title: str | None,
    description: str | None = None,
    message: str | None = None,
    project_path: str,
    route_key: str,
    profiles: Mapping[str, str | None],
    sandbox: str = DEFAULT_SANDBOX,
    worktree_mode: str = DEFAULT_WORKTREE_MODE,
    manual_break_glass: bool = False,
    step_timeout: int | None = None,
    step_idle_timeout: int | None = None,
) -> dict[str, Any]:
    """Spec body ``{"version", "goal", "steps"}`` for a generated route workflow.

    todos-task routes pass the task ``description``; generic routes pass the event
    ``message`` (either keyword works; ``description`` wins when both are given).
    Every agent target carries the ``sandbox``, the run's ``worktreeMode`` (the runner
    gives the run its own git worktree from it) and, with ``manual_break_glass``,
    upstream's ``manual-break-glass`` allowlist marker; ``step_timeout`` and
    ``step_idle_timeout`` (seconds, the route's) become each agent step's ``timeoutMs`` and
    ``idleTimeoutMs`` (without them the runner applies its settings' defaults).
    """
    limits = {
        key: seconds * 1000
        for key, seconds in (
            ("timeoutMs", step_timeout),
            ("idleTimeoutMs", step_idle_timeout),
        )
        if seconds
    }
    roles = roles_for_template(template_id)
    noun = "event" if route_key == GENERIC_EVENT else "task"
    body = description if description is not None else message
    steps: list[dict[str, Any]] = []
    previous: str | None = None
    for role in roles:
        steps.append(
            {
                "id": role,
                "role": role,
                "kind": "agent",
                "dependsOn": [previous] if previous else [],
                "target": {
                    "type": "agent",
                    "provider": provider,
                    "authProfile": profiles.get(role),
                    "cwd": project_path,
                    "prompt": _prompt(
                        role=role,
                        noun=noun,
                        title=title,
                        body=body,
                        project_path=project_path,
                        route_key=route_key,
                    ),
                    "sandbox": sandbox,
                    "worktreeMode": worktree_mode,
                    **(
                        {"allowlist": break_glass_allowlist()}
                        if manual_break_glass
                        else {}
                    ),
                },
                "routing": {"role": role},
                **limits,
            }
        )
        previous = role
    return {"version": 1, "goal": None, "steps": steps}


def step_role(step: Mapping[str, Any]) -> str | None:
    """The role a generated step plays (its `routing.role`), None for any other step."""
    for routing in (step.get("routing"), (step.get("target") or {}).get("routing")):
        if isinstance(routing, dict):
            role = routing.get("role")
            if isinstance(role, str) and role:
                return role
    return None


def pool_roles_by_step(
    spec: Mapping[str, Any], provider: str = POOL_PROVIDER
) -> dict[str, str]:
    """step id → role for the agent steps of ``provider`` pool assignment may re-target."""
    out: dict[str, str] = {}
    for step in spec.get("steps", []):
        target = step.get("target") or {}
        if target.get("type") != "agent" or target.get("provider") != provider:
            continue
        role = step_role(step)
        if role:
            out[step["id"]] = role
    return out


def apply_pool_profiles(
    spec: Mapping[str, Any], profiles: Mapping[str, str], provider: str = POOL_PROVIDER
) -> dict[str, Any]:
    """A copy of ``spec`` with each pool-routed step's ``authProfile`` set from its role.

    Steps whose role got no profile keep their render-time choice.
    """
    result = copy.deepcopy(dict(spec))
    roles = pool_roles_by_step(result, provider)
    for step in result.get("steps", []):
        chosen = profiles.get(roles.get(step["id"], ""))
        if chosen:
            step["target"]["authProfile"] = chosen
    return result


def step_account(step: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(account_profile, account_tool) recorded on a step run (docs/upstream.md §2.3).

    1. ``account`` = the step's account ref, else the target's (``{profile, tool?}``).
    2. profile = account.profile, else the agent target's ``authProfile``, else None.
    3. tool = account.tool, else the agent ``provider`` when it has an ``authProfile``,
       else None. A command step without an account ref records (None, None).
    """
    target = step.get("target")
    target = target if isinstance(target, dict) else {}
    account = step.get("account")
    if not isinstance(account, dict):
        account = target.get("account")
    account = account if isinstance(account, dict) else {}
    is_agent = target.get("type") == "agent"

    def text(value: object) -> str | None:
        return value if isinstance(value, str) and value else None

    auth_profile = text(target.get("authProfile")) if is_agent else None
    profile = text(account.get("profile")) or auth_profile
    tool = text(account.get("tool")) or (
        text(target.get("provider")) if auth_profile else None
    )
    return profile, tool
