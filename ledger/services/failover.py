"""Account failover for a step about to start: when its account cannot take it (cooling,
disabled in the registry, its login failed, at its cap) or just reported a rate limit, move the step to
another member of the pool its run was admitted with.

Rules:
1. Only steps of runs admitted with pool routing on (`scope_json.providerRouting.poolRouting`)
   and of the route's provider move; pinned profiles (`--*-auth-profile`) switch pool routing
   off at admission, so they never move, and neither does a single `--auth-profile`.
2. A free member is enabled (or unregistered), its login not failed, not cooling, and
   below its cap: running steps
   < min(the step's maxPerProfile, the account's max_running), either when set.
3. Among free members: first those no other step of this run uses (verifier != worker where
   possible), then the least load (running + reserved), then pool order.
4. The caller holds the admission lock and the run row lock; the move rewrites the step's
   `account_profile` (its attribution) and appends a `step_account_moved` event with the
   old and new account, the reason code and the reason.

Step start calls `step_failover` (ledger/services/steps.py); the runner calls
`step_move_after_rate_limit` after a step reported a rate limit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from ledger.loads import apply_load_delta, load_change, run_load
from ledger.lock import admission_lock
from ledger.models import StepStatus, WorkflowRun, WorkflowStepRun
from ledger.selectors import RegisteredAccount, account_registry, account_state
from ledger.services.common import (
    append_event,
    lock_step,
    now_or_default,
    step_max_per_profile,
    step_spec,
)

MOVED_EVENT = "step_account_moved"
RATE_LIMIT_CODE = "rate_limit"


def run_pool(run: WorkflowRun) -> tuple[str, list[str]] | None:
    """(provider, pool) when `run` was admitted with pool routing on, else None."""
    invocation = run.invocation
    scope = getattr(invocation, "scope_json", None) if invocation else None
    routing = scope.get("providerRouting") if isinstance(scope, dict) else None
    if not isinstance(routing, dict) or routing.get("poolRouting") is not True:
        return None
    pool = routing.get("pool")
    provider = routing.get("provider")
    if not isinstance(pool, list) or not isinstance(provider, str):
        return None
    members = [str(p).strip() for p in pool if str(p).strip()]
    return (provider, members) if len(members) >= 2 else None


def account_limit(
    spec: dict[str, Any], account: RegisteredAccount | None
) -> int | None:
    """The running cap of a step on `account`: the stricter of maxPerProfile and the
    registry's max_running (None when neither is set)."""
    limits = [
        n
        for n in (step_max_per_profile(spec), account.max_running if account else None)
        if n is not None
    ]
    return min(limits) if limits else None


def _free_member(
    run: WorkflowRun, step: WorkflowStepRun, spec: dict[str, Any], now: datetime
) -> str | None:
    context = run_pool(run)
    if context is None:
        return None
    provider, pool = context
    target = found if isinstance(found := spec.get("target"), dict) else {}
    if target.get("type") != "agent" or target.get("provider") != provider:
        return None
    state = account_state(now=now)
    registry = account_registry(pool)
    loads = state.load.total()
    used = set(
        WorkflowStepRun.objects.filter(workflow_run_id=run.id)
        .exclude(pk=step.pk)
        .exclude(status=StepStatus.SKIPPED)
        .exclude(account_profile__isnull=True)
        .values_list("account_profile", flat=True)
    )
    best: tuple[bool, int, int, str] | None = None
    for position, member in enumerate(pool):
        if member == step.account_profile or member in state.cooling:
            continue
        account = registry.get(member)
        if account is not None and (
            not account.enabled or account.login_failed or account.provider != provider
        ):
            continue
        limit = account_limit(spec, account)
        if limit is not None and state.load.running.get(member, 0) >= limit:
            continue
        key = (member in used, loads.get(member, 0), position, member)
        if best is None or key < best:
            best = key
    return best[3] if best else None


def step_failover(
    *,
    run: WorkflowRun,
    step: WorkflowStepRun,
    steps: list[WorkflowStepRun],
    code: str,
    reason: str,
    now: datetime,
) -> str | None:
    """Move `step` (locked by the caller with its run's `steps`, under the admission lock)
    to a free pool member; returns the new account, or None when there is none (rules 1-4).
    The caller applies the change in account load with its own (ledger.loads: computed from
    `steps` when it locked them and when it is done, so the run's reservation moves with
    its first step)."""
    spec = step_spec(run, step.step_id)
    chosen = _free_member(run, step, spec, now)
    if chosen is None:
        return None
    previous = step.account_profile
    step.account_profile = chosen
    step.save(update_fields=["account_profile", "updated_at"])
    append_event(
        run.id,
        MOVED_EVENT,
        step_id=step.step_id,
        payload={"from": previous, "to": chosen, "code": code, "reason": reason},
    )
    return chosen


def step_move_after_rate_limit(
    *, step_run_id: str, reason: str, now: datetime | None = None
) -> str | None:
    """After a rate-limited attempt, move the (finished, failed) step to a free pool
    member so the runner can try it again; None when no member is free."""
    now = now_or_default(now)
    with transaction.atomic():
        admission_lock()
        run, step, steps = lock_step(step_run_id)
        if step.status not in (StepStatus.FAILED, StepStatus.TIMED_OUT):
            return None
        before = run_load(run.status, steps)
        moved = step_failover(
            run=run,
            step=step,
            steps=steps,
            code=RATE_LIMIT_CODE,
            reason=reason,
            now=now,
        )
        apply_load_delta(load_change(before, run_load(run.status, steps)))
        return moved
