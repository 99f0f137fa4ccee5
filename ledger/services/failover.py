"""Account failover for a step about to start: when its account cannot take it (cooling,
disabled in the registry, its login failed, at its cap) or just reported a rate limit, move the step to
another member of the pool its run was admitted with.

Rules:
1. Only steps of runs admitted with pool routing on (`scope_json.providerRouting.poolRouting`)
   and of the route's provider move; pinned profiles (`--*-auth-profile`) switch pool routing
   off at admission, so they never move, and neither does a single `--auth-profile`.
2. A free member is enabled (or unregistered), its login not failed, not cooling, its
   rate-limit windows not spent (ledger.windows, domain.windows), and below its cap: running steps
   < min(the step's maxPerProfile, the account's max_running), either when set.
3. Among free members: first those no other step of this run uses (verifier != worker where
   possible), then the least load (running + reserved), then pool order.
4. The caller holds the admission lock and the run row lock; the move rewrites the step's
   `account_profile` (its attribution) and appends a `step_account_moved` event with the
   old and new account, the reason code and the reason.

5. A whole-pool limit waits: when every usable member (enabled, of the route's provider)
   is cooling, a step start is refused with `pool_rate_limited` until the earliest cooldown
   ends (`pool_refusal`), and the runner parks the run meanwhile. A wait that would last
   LOOPSWEB_POOL_WAIT_SECONDS or more from its first such `step_waiting` event is over
   (`pool_wait_over`): the runner ends the run with that reason.

Step start calls `step_failover` (ledger/services/steps.py); the runner calls
`step_move_after_rate_limit` after a step reported a rate limit.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.lock import admission_lock
from ledger.models import StepStatus, WorkflowEvent, WorkflowRun, WorkflowStepRun
from ledger.selectors import RegisteredAccount, account_registry, account_state
from ledger.services.account_loads import apply_load_delta, load_change, run_load
from ledger.services.common import (
    POOL_WAIT_OVER,
    WAIT_POOL_RATE_LIMITED,
    append_event,
    lock_step,
    now_or_default,
    step_max_per_profile,
    step_spec,
)
from ledger.windows import pool_windows

MOVED_EVENT = "step_account_moved"
RATE_LIMIT_CODE = "rate_limit"
POOL_RATE_LIMITED_CODE = "pool_rate_limited"
POOL_WAIT_OVER_CODE = "pool_wait_over"


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
    windows = pool_windows(pool, spec, now, loads)
    best: tuple[bool, int, float, int, str] | None = None
    for position, member in enumerate(pool):
        if member == step.account_profile or member in state.cooling:
            continue
        if member in windows.exhausted:
            continue
        account = registry.get(member)
        if account is not None and (
            not account.enabled or account.login_failed or account.provider != provider
        ):
            continue
        limit = account_limit(spec, account)
        if limit is not None and state.load.running.get(member, 0) >= limit:
            continue
        room = windows.headroom.get(member, 1.0)
        key = (member in used, loads.get(member, 0), -room, position, member)
        if best is None or key < best:
            best = key
    return best[4] if best else None


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
    The caller applies the change in account load with its own (ledger.services.account_loads:
    computed from
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


def pool_cooling_until(run: WorkflowRun, now: datetime) -> datetime | None:
    """The earliest end of a cooldown when every usable member of the run's pool is cooling
    (rule 5), else None (not pool-routed, or some member is not cooling)."""
    context = run_pool(run)
    if context is None:
        return None
    provider, pool = context
    cooling = account_state(now=now).cooling
    registry = account_registry(pool)
    ends = []
    for member in pool:
        account = registry.get(member)
        if account is not None and (
            not account.enabled or account.provider != provider
        ):
            continue
        until = cooling.get(member)
        if until is None:
            return None
        ends.append(until)
    return min(ends) if ends else None


def pool_refusal(
    run: WorkflowRun, step: WorkflowStepRun, until: datetime, now: datetime
) -> tuple[str, str, datetime | None]:
    """The refusal of a step whose whole pool cools until `until` (rule 5): wait until
    then; the wait is over when it would last LOOPSWEB_POOL_WAIT_SECONDS or more from its
    first `step_waiting` event (0: no wait at all)."""
    reason = WAIT_POOL_RATE_LIMITED.format(
        until=timezone.localtime(until).strftime("%H:%M")
    )
    bound = int(settings.LOOPSWEB_POOL_WAIT_SECONDS)
    began = (
        WorkflowEvent.objects.filter(
            workflow_run_id=run.id,
            event_type="step_waiting",
            step_id=step.step_id,
            payload_json__code=POOL_RATE_LIMITED_CODE,
        )
        .order_by("sequence")
        .values_list("created_at", flat=True)
        .first()
    )
    # Over once it has lasted the bound, or at once when the earliest end lies beyond it.
    if max(now, until) >= (began or now) + timedelta(seconds=bound):
        return (
            POOL_WAIT_OVER_CODE,
            POOL_WAIT_OVER.format(seconds=bound, reason=reason),
            None,
        )
    return POOL_RATE_LIMITED_CODE, reason, until


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
