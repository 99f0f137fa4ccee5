"""Account failover for a step about to start: when its account cannot take it (cooling,
disabled in the registry, its login failed, unresponsive, at its cap) or just failed it (a
rate limit, a refused login, a hang: `step_move_after_failure`), move the step to another
member of the pool its run was admitted with.

Rules:
1. **Only pool-routed steps move.** Only steps of runs admitted with pool routing on
   (`scope_json.providerRouting.poolRouting`) and of the route's provider move; pinned
   profiles (`--*-auth-profile`) switch pool routing off at admission, so they never move,
   and neither does a single `--auth-profile`.
2. **A free member** is enabled (or unregistered), its login not failed, not unresponsive
   (a hang's cool-off, LOOPSWEB_UNRESPONSIVE_SECONDS), not cooling, its
   rate-limit windows not spent (ledger.windows, domain.windows), and below its cap: running steps
   < min(the step's maxPerProfile, the account's max_running), either when set.
3. **Worker ≠ verifier**, always: a step never moves onto an account a step of the other of
   the two roles (`routing.role` worker / verifier) of the same run has started on
   (`role_excluded`); such an account is not free for it. Among free members: first those
   no other step of this run uses (a pending step's planned account: it moves at its own
   start), then the least load (running + reserved), then pool order.
4. **The move.** The caller holds the admission lock and the run row lock; the move rewrites
   the step's `account_profile` (its attribution) and appends a `step_account_moved` event
   with the old and new account, the reason code and the reason.

5. **A whole-pool limit waits**: when every usable member (enabled, of the route's provider)
   is cooling, a step start is refused with `pool_rate_limited` until the earliest cooldown
   ends (`pool_refusal`), and the runner parks the run meanwhile. So is a step whose only
   free member is the other role's (see "worker ≠ verifier") while every other usable member
   cools: it waits for them, the reason ends "(worker ≠ verifier)". (A step whose pool's
   other members are busy at their caps waits as an account at its cap does,
   `role_conflict`.) A wait that would last LOOPSWEB_POOL_WAIT_SECONDS or more from its
   first such `step_waiting` event is over (`pool_wait_over`): the runner ends the run with
   that reason.

6. **An account's failure moves the step**, never fails the task: after a rate limit, a
   refused login or a hang the runner calls `step_move_after_failure` (the event's code:
   `rate_limit`, `login_failed`, `unresponsive`). When no member is free, a rate limit waits
   as "a whole-pool limit waits" says; a refused login or a hang fails the run only when no
   other member is left at all (`pool_member_left`: enabled, login not failed, not
   unresponsive), else the step waits for one.

7. **A per-minute limit pauses**, it does not rotate: a 429 whose named reset is at most
   LOOPSWEB_THROTTLE_SECONDS off cools its account until then, and the step stays on it
   (`step_pause`, a `step_waiting` event `account_paused`), starting again once the reset
   has passed, a little later for each (the runner's stagger) so paused steps do not all
   start at once. The pool is not rotated for it; a longer limit, or none named, moves.

Step start calls `step_failover` (ledger/services/steps.py); the runner calls
`step_move_after_failure` after an attempt failed on its account.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from domain import reasons
from domain.pool import LOGIN_FAILED_REASON
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
from ledger.services.notifications import notify_pool_exhausted
from ledger.windows import pool_windows

MOVED_EVENT = "step_account_moved"
RATE_LIMIT_CODE = "rate_limit"
LOGIN_FAILED_CODE = reasons.LOGIN_FAILED
UNRESPONSIVE_CODE = reasons.UNRESPONSIVE
POOL_RATE_LIMITED_CODE = "pool_rate_limited"
POOL_WAIT_OVER_CODE = "pool_wait_over"
ROLE_CONFLICT_CODE = "role_conflict"
ACCOUNT_PAUSED_CODE = "account_paused"
WAIT_ACCOUNT_PAUSED = (
    "account {profile} answered a per-minute rate limit (reset {until}): the step stays "
    "on it and starts again after the reset"
)
# The two roles that never share an account in one run ("worker ≠ verifier", module
# docstring).
SEPARATE_ROLES = ("worker", "verifier")
WAIT_ROLE_CONFLICT = (
    "account {profile} is the run's {role} account (worker ≠ verifier); "
    "no other account of the pool is free"
)
ROLE_NO_OTHER = (
    "no account of the pool but {profile} (the run's {role} account) can take this "
    "step (worker ≠ verifier): {why}"
)
WAIT_OTHERS_RATE_LIMITED = (
    "every other account of the pool is busy or rate limited until {until} "
    "(worker ≠ verifier)"
)


def step_role(spec: dict[str, Any]) -> str | None:
    """The step's `routing.role` (on the step or its target), None when it has none."""
    target = spec.get("target")
    for routing in (
        spec.get("routing"),
        target.get("routing") if isinstance(target, dict) else None,
    ):
        role = routing.get("role") if isinstance(routing, dict) else None
        if isinstance(role, str) and role:
            return role
    return None


def role_excluded(
    run: WorkflowRun, step: WorkflowStepRun, steps: list[WorkflowStepRun]
) -> dict[str, str]:
    """Account -> role for the accounts `step` must not use ("worker ≠ verifier", module
    docstring): those the run's other steps of the other of worker/verifier started on
    (running or finished, not pending or skipped). Empty for a step of neither role."""
    role = step_role(step_spec(run, step.step_id))
    if role not in SEPARATE_ROLES:
        return {}
    out: dict[str, str] = {}
    for other in steps:
        if (
            other.pk == step.pk
            or not other.account_profile
            or other.status in (StepStatus.PENDING, StepStatus.SKIPPED)
        ):
            continue
        other_role = step_role(step_spec(run, other.step_id))
        if other_role in SEPARATE_ROLES and other_role != role:
            out[other.account_profile] = other_role
    return out


def role_refusal(
    step: WorkflowStepRun, excluded: dict[str, str]
) -> tuple[str, str, datetime | None] | None:
    """The refusal of a step whose own account is one it must not use ("worker ≠
    verifier", module docstring)."""
    profile = step.account_profile
    if not profile or profile not in excluded:
        return None
    return (
        ROLE_CONFLICT_CODE,
        WAIT_ROLE_CONFLICT.format(profile=profile, role=excluded[profile]),
        None,
    )


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
    others = list(
        WorkflowStepRun.objects.filter(workflow_run_id=run.id)
        .exclude(pk=step.pk)
        .exclude(status=StepStatus.SKIPPED)
        .exclude(account_profile__isnull=True)
    )
    used = {other.account_profile for other in others}
    excluded = role_excluded(run, step, others)
    windows = pool_windows(pool, spec, now, loads)
    best: tuple[bool, int, float, int, str] | None = None
    for position, member in enumerate(pool):
        if member == step.account_profile or member in state.cooling:
            continue
        if member in excluded:
            continue
        if member in windows.exhausted:
            continue
        account = registry.get(member)
        if account is not None and (
            not account.enabled
            or account.login_failed
            or account.unresponsive_at(now)
            or account.provider != provider
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
    to a free pool member; returns the new account, or None when there is none (module
    docstring, "only pool-routed steps move" to "the move").
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


def pool_cooling_until(
    run: WorkflowRun, now: datetime, excluded: Collection[str] = ()
) -> datetime | None:
    """The earliest end of a cooldown when every usable member of the run's pool but the
    `excluded` ones ("worker ≠ verifier", module docstring) is cooling ("a whole-pool limit
    waits"), else None (not pool-routed, or some member is not cooling)."""
    context = run_pool(run)
    if context is None:
        return None
    provider, pool = context
    cooling = account_state(now=now).cooling
    registry = account_registry(pool)
    ends = []
    for member in pool:
        account = registry.get(member)
        if member in excluded or (
            account is not None
            and (not account.enabled or account.provider != provider)
        ):
            continue
        until = cooling.get(member)
        if until is None:
            return None
        ends.append(until)
    return min(ends) if ends else None


def pool_refusal(
    run: WorkflowRun,
    step: WorkflowStepRun,
    until: datetime,
    now: datetime,
    *,
    others_only: bool = False,
) -> tuple[str, str, datetime | None]:
    """The refusal of a step whose whole pool cools until `until` ("a whole-pool limit
    waits", module docstring; `others_only`: every member but the other role's, "worker ≠
    verifier"): wait until then; the wait is over when it would last
    LOOPSWEB_POOL_WAIT_SECONDS or more from its first `step_waiting` event (0: no wait at
    all)."""
    template = WAIT_OTHERS_RATE_LIMITED if others_only else WAIT_POOL_RATE_LIMITED
    reason = template.format(until=timezone.localtime(until).strftime("%H:%M"))
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


def pool_wait(
    run: WorkflowRun,
    step: WorkflowStepRun,
    refusal: tuple[str, str, datetime | None],
    excluded: dict[str, str],
    now: datetime,
) -> tuple[str, str, datetime | None]:
    """What a refused start that found no free member waits for. A cooling account, or one
    the other role started on ("worker ≠ verifier", module docstring), waits for the
    earliest cooldown of the members left ("a whole-pool limit waits": `pool_refusal`). When
    some account is `excluded` and no other member could ever take the step (each disabled,
    its login failed: an operator must act), the wait is over at once (`pool_wait_over`),
    naming them. Otherwise `refusal`."""
    if refusal[0] in ("cooldown", ROLE_CONFLICT_CODE):
        until = pool_cooling_until(run, now, excluded)
        if until is not None:
            whole = not excluded or pool_cooling_until(run, now) is not None
            if whole and (context := run_pool(run)) is not None:
                # The whole pool cools and this step waits: an episode an operator is
                # told about, once (docs/operations.md "Notifications").
                notify_pool_exhausted(
                    members=context[1],
                    provider=context[0],
                    until=until,
                    now=now,
                    waiting=f"step {step.step_id} of run {run.id}",
                )
            return pool_refusal(run, step, until, now, others_only=not whole)
    why = _others_unusable(run, excluded) if excluded else None
    if why is None:
        return refusal
    profile, role = next(iter(excluded.items()))
    return (
        POOL_WAIT_OVER_CODE,
        ROLE_NO_OTHER.format(profile=profile, role=role, why=why),
        None,
    )


def _others_unusable(run: WorkflowRun, excluded: Collection[str]) -> str | None:
    """Why every member of the run's pool but the `excluded` ones stays unusable until an
    operator acts (disabled, its login failed), or None when one is usable or may become
    so by itself (cooling, busy, unresponsive, unregistered)."""
    context = run_pool(run)
    if context is None:
        return None
    provider, pool = context
    registry = account_registry(pool)
    why = []
    for member in pool:
        account = registry.get(member)
        if member in excluded or (account and account.provider != provider):
            continue
        if account is None or (account.enabled and not account.login_failed):
            return None
        why.append(
            LOGIN_FAILED_REASON.format(name=member)
            if account.login_failed
            else f"account {member}: disabled"
        )
    return "; ".join(why) or None


def pool_member_left(run: WorkflowRun, step: WorkflowStepRun, now: datetime) -> bool:
    """Whether the run's pool has a member other than the step's account that could take the
    step once free ("an account's failure moves the step", module docstring): enabled (or
    unregistered), of the route's provider, its login not failed, not unresponsive; a
    cooling or busy member counts."""
    context = run_pool(run)
    if context is None:
        return False
    provider, pool = context
    registry = account_registry(pool)
    for member in pool:
        if member == step.account_profile:
            continue
        account = registry.get(member)
        if account is None or (
            account.enabled
            and account.provider == provider
            and not account.login_failed
            and not account.unresponsive_at(now)
        ):
            return True
    return False


def step_move_after_failure(
    *,
    step_run_id: str,
    reason: str,
    code: str = RATE_LIMIT_CODE,
    now: datetime | None = None,
) -> str | None:
    """After an attempt that failed on its account (`code`: a rate limit, a refused login,
    a hang), move the (finished, failed or timed out) step to a free pool member so the
    runner can try it again; None when no member is free."""
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
            code=code,
            reason=reason,
            now=now,
        )
        apply_load_delta(load_change(before, run_load(run.status, steps)))
        return moved


def step_pause(*, step_run_id: str, until: datetime) -> None:
    """Record that a finished step waits out its account's per-minute limit ("a per-minute
    limit pauses", module docstring)."""
    with transaction.atomic():
        run, step, _ = lock_step(step_run_id)
        stamp = timezone.localtime(until).strftime("%H:%M:%S")
        append_event(
            run.id,
            "step_waiting",
            step_id=step.step_id,
            payload={
                "code": ACCOUNT_PAUSED_CODE,
                "reason": WAIT_ACCOUNT_PAUSED.format(
                    profile=step.account_profile, until=stamp
                ),
            },
        )


def step_pauses(*, run_id: str, step_id: str) -> int:
    """How many per-minute pauses ("a per-minute limit pauses", module docstring) the run's
    step waited out on its account since it last moved: counted from the run's events, so a
    run handed back between pauses counts them all."""
    events = WorkflowEvent.objects.filter(
        workflow_run_id=run_id,
        step_id=step_id,
        event_type__in=("step_waiting", MOVED_EVENT),
    ).order_by("-sequence")
    pauses = 0
    for event_type, payload in events.values_list("event_type", "payload_json"):
        if event_type == MOVED_EVENT:
            break
        if isinstance(payload, dict) and payload.get("code") == ACCOUNT_PAUSED_CODE:
            pauses += 1
    return pauses
