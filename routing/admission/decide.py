"""Stage 2's decision, made before any write, in one place for one candidate or many.

- `Hold`: a cap (or the pool) already full for an item that has not run. Nothing is written
  for it but, in a drain, its inbox row (reported as throttled with `precheck: true`).
- `precheck`: the throttle decision (route scope, project, group: docs/upstream.md §3.7
  order) and then the pool assignment, each read through a callable, so one candidate reads
  the ledger (`transaction.admit`) and a batch reads counts it keeps in memory
  (`batch.admit_batch`) through the same code.
- `FullCaps`: the caps a drain has seen full, so later candidates are held without a read.
- `scope_hold`: a drain's scope already at --max-active before it scans anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from domain import reasons
from domain.pool import (
    LOGIN_FAILED_REASON,
    UNRESPONSIVE_REASON,
    PoolAssignment,
    assign_pool_auth_profiles,
)
from domain.throttle import (
    AdmissionDecision,
    ThrottleCounts,
    ThrottleLimits,
    admission_decision,
)
from domain.windows import DEFAULT_MAX_WINDOW_USED, Window, window_filter
from ledger.selectors import (
    AccountLimits,
    RegisteredAccount,
    account_registry,
    account_state,
    active_counts,
)
from ledger.services.notifications import notify_pool_exhausted
from ledger.windows import budgets_of, state_windows
from routing.admission.plan import RoutePlan


@dataclass(frozen=True)
class Hold:
    """A cap already full for an item not yet routed: why (the upstream-style reason) and
    the stable reason code."""

    reason: str
    code: str


@dataclass(frozen=True)
class PoolView:
    """A pool assignment with the loads and cooldowns it was decided on."""

    assignment: PoolAssignment
    loads: dict[str, int]
    cooling: dict[str, datetime]
    # The pool members' rate-limit windows it was decided on (domain.windows).
    windows: dict[str, list[Window]] = field(default_factory=dict)

    def windows_snapshot(self) -> dict[str, list[dict[str, object]]]:
        """Each member's windows, for the deferral snapshot."""
        return {
            name: [w.to_dict() for w in seen] for name, seen in self.windows.items()
        }

    @property
    def deferral_reason(self) -> str:
        """Why the pool defers (a cooldown says when the first member frees)."""
        reason = self.assignment.reason or "pool deferred"
        if self.assignment.reason_code == reasons.COOLDOWN and self.cooling:
            first_free = min(self.cooling.values())
            reason = f"{reason} until {first_free.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        return reason


def pool_view(
    plan: RoutePlan,
    *,
    loads: dict[str, int],
    cooling: dict[str, datetime],
    registry: Mapping[str, AccountLimits | RegisteredAccount],
    windows: Mapping[str, Sequence[Window]] | None = None,
    now: datetime | None = None,
) -> PoolView:
    """Least-loaded assignment for this plan's pool from the given loads, cooldowns,
    account registry rows (disabled members and those whose login failed are absent; a
    member's max_running caps it) and rate-limit windows (a spent one removes its member
    until its reset: domain.windows)."""
    members_cooling = {p: until for p, until in cooling.items() if p in plan.pool}
    members = {p.strip() for p in plan.pool}
    seen = {name: list(w) for name, w in (windows or {}).items() if name in members}
    at = now or timezone.now()
    max_used = plan.max_window_used or DEFAULT_MAX_WINDOW_USED
    paced = {
        name for name, row in registry.items() if name in members and row.window_pace
    }
    spent = window_filter(
        list(plan.pool),
        seen,
        at,
        max_used,
        paced=paced,
        running=loads,
    )
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
        login_failed=tuple(
            name
            for name, row in registry.items()
            if name in members and row.login_failed
        ),
        unresponsive=tuple(
            name
            for name, row in registry.items()
            if name in members and row.unresponsive_at(at)
        ),
        account_caps={
            name: row.max_running
            for name, row in registry.items()
            if name in members and row.max_running is not None
        },
        windows=spent,
    )
    return PoolView(
        assignment=assignment, loads=loads, cooling=members_cooling, windows=seen
    )


def pool_assignment_now(plan: RoutePlan, now: datetime) -> PoolView:
    """Least-loaded assignment for this plan's pool from the ledger as it is now (one read:
    the loads, the cooldowns, the pool members' registry rows and their rate-limit windows;
    more only for the estimates of members with window budgets)."""
    state = account_state(now=now, accounts=plan.pool, windows=True)
    budgeted = {name: row.window_budgets for name, row in state.limits.items()}
    return pool_view(
        plan,
        loads=state.load.total(),
        cooling=state.cooling,
        registry=state.limits,
        windows=state_windows(
            state, {n: budgets_of(n) for n, has in budgeted.items() if has}, now
        ),
        now=now,
    )


def throttle_hold(decision: AdmissionDecision) -> Hold | None:
    if decision.allowed:
        return None
    return Hold(decision.reason or "", decision.reason_code or reasons.ROUTE_CAP)


def pool_hold(view: PoolView) -> Hold | None:
    if not view.assignment.deferred:
        return None
    return Hold(
        view.deferral_reason, view.assignment.reason_code or reasons.PROFILE_CAP
    )


# The holds of a pool assignment: no member of the pool can take the step now.
POOL_HOLD_CODES = (
    reasons.PROFILE_CAP,
    reasons.COOLDOWN,
    reasons.ACCOUNT_DISABLED,
    reasons.LOGIN_FAILED,
    reasons.UNRESPONSIVE,
    reasons.WINDOW_EXHAUSTED,
    reasons.WINDOW_PACED,
)


@dataclass
class FullCaps:
    """Caps a drain has seen full, to hold later candidates without reads.

    - `every`: the scope, or a pool that every candidate shares (--auth-profile-pool), is
      full: every later candidate is held unread.
    - `keys`: a full project or group holds its later candidates without a count; a full
      pool an event names itself (pool routing on) holds the later candidates routed to
      the same pool, roles and limits without reading the pool again. Within one drain
      loads only grow, so what was full stays full.
    """

    every: Hold | None = None
    keys: dict[tuple[str, str | None], Hold] = field(default_factory=dict)

    def held(self, plan: RoutePlan) -> Hold | None:
        for key in (
            ("project", plan.project_path),
            ("group", plan.project_group),
            ("pool", _pool_key(plan)),
        ):
            if key in self.keys:
                return self.keys[key]
        return None

    def saw(self, plan: RoutePlan, hold: Hold, *, shared_pool: bool) -> None:
        code = hold.code
        pool = code in POOL_HOLD_CODES
        if code == reasons.ROUTE_CAP or (shared_pool and pool):
            self.every = hold
        elif pool and plan.pool_active:
            self.keys[("pool", _pool_key(plan))] = hold
        elif code == reasons.PROJECT_CAP and plan.project_path:
            self.keys[("project", plan.project_path)] = hold
        elif code == reasons.GROUP_CAP and plan.project_group:
            self.keys[("group", plan.project_group)] = hold

    def copy_from(self, other: FullCaps) -> None:
        self.every = other.every
        self.keys.clear()
        self.keys.update(other.keys)


def _pool_key(plan: RoutePlan) -> str | None:
    """What decides a pool's assignment besides the loads (None: the pool does not route):
    its members, the roles that need one, --max-per-profile and --max-window-used."""
    if not plan.pool_active:
        return None
    return repr(
        (plan.pool, plan.roles, plan.max_per_profile, str(plan.max_window_used))
    )


@dataclass(frozen=True)
class Precheck:
    """What `precheck` decided: the hold (None: go on to admission), and the throttle
    decision and pool view it was made from (None where it did not get that far)."""

    hold: Hold | None
    decision: AdmissionDecision | None
    view: PoolView | None


def precheck(
    plan: RoutePlan,
    *,
    counts: Callable[[], ThrottleCounts],
    view: Callable[[], PoolView],
    caps: FullCaps | None = None,
) -> Precheck:
    """The hold for one plan: a project or group `caps` already saw full, else the throttle
    decision on `counts()` (only when a cap is set), else the pool assignment `view()` (only
    when the pool decides). Each source is read only when the decision gets to it.

    A plan with a `refusal` is never held: its worktree check comes before the caps
    (docs/upstream.md §3.2.10), so admission dedupes or refuses it."""
    if plan.refusal is not None:
        return Precheck(hold=None, decision=None, view=None)
    hold = caps.held(plan) if caps is not None else None
    decision: AdmissionDecision | None = None
    pool: PoolView | None = None
    if hold is None and plan.limits.any_set:
        decision = admission_decision(
            scope=plan.scope,
            project_path=plan.project_path,
            project_group=plan.project_group,
            counts=counts(),
            limits=plan.limits,
        )
        hold = throttle_hold(decision)
    if hold is None and plan.pool_active:
        pool = view()
        hold = pool_hold(pool)
        if hold is not None and hold.code == reasons.COOLDOWN and pool.cooling:
            # Every member cools and new work waits for the pool: an episode an operator
            # is told about, once (docs/operations.md "Notifications"; off: no query).
            notify_pool_exhausted(
                members=plan.pool,
                provider=plan.provider,
                until=min(pool.cooling.values()),
                now=timezone.now(),
                waiting=f"new work of route scope {plan.scope}",
            )
    if hold is None and not plan.pool_active:
        hold = pinned_hold(plan)
    return Precheck(hold=hold, decision=decision, view=pool)


PINNED_DISABLED_REASON = "account {name}: disabled in the account registry"


def pinned_hold(plan: RoutePlan) -> Hold | None:
    """A route pinned to an account that cannot start (its login failed, it is disabled, it
    is unresponsive) is deferred with the reason, as a pool of that one account is, never
    admitted to wait silently (one read, only when a step names an account)."""
    pinned = sorted(
        {
            str(target["authProfile"]).strip()
            for step in plan.spec.get("steps") or []
            if isinstance(target := step.get("target"), dict)
            and target.get("type") == "agent"
            and target.get("authProfile")
        }
    )
    if not pinned:
        return None
    for name, row in sorted(account_registry(pinned).items()):
        if not row.enabled:
            return Hold(
                PINNED_DISABLED_REASON.format(name=name), reasons.ACCOUNT_DISABLED
            )
        if row.login_failed:
            return Hold(LOGIN_FAILED_REASON.format(name=name), reasons.LOGIN_FAILED)
        if row.unresponsive_at(timezone.now()):
            return Hold(UNRESPONSIVE_REASON.format(name=name), reasons.UNRESPONSIVE)
    return None


def scope_hold(scope: str, limits: ThrottleLimits) -> Hold | None:
    """The hold of a drain whose scope is at --max-active before it scans anything."""
    if limits.max_active is None:
        return None
    seen = active_counts(scope=scope, project_key=None, project_group=None)
    return throttle_hold(
        admission_decision(
            scope=scope,
            project_path="",  # the scope's cap only: no project (its count is 0)
            project_group=None,
            counts=ThrottleCounts(scope=seen.scope, project=0, project_group=None),
            limits=limits,
        )
    )
