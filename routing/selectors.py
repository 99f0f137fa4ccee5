"""Reads shared by the JSON API, the /ops pages and /metrics, so the three agree:

- account rows: running and reserved load, `--max-per-profile`, cooldowns, the registry,
  token usage, step outcomes over time windows (/ops/accounts/, /api/v1/accounts, /metrics);
- live work per route scope against its cap (the /ops overview, /metrics), from one pass
  over the live rows that the overview also sums per group, project and reason;
- deferred work items per reason code (the /ops overview, /metrics);
- inbox depth: pending, deferred and failed events per state (the /ops overview, /metrics).

Each aggregates in SQL over an index-bounded scan (see routing.ops.selectors), so a
page's or a scrape's query count stays flat as the ledger grows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Exists,
    F,
    Min,
    OuterRef,
    Q,
    Sum,
    When,
)
from django.db.models.functions import TruncHour
from django.utils import timezone

from domain.windows import DEFAULT_MAX_WINDOW_USED, Window
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    AccountCooldown,
    StepReasonCode,
    StepStatus,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.selectors import (
    RegisteredAccount,
    account_registry,
    account_state,
    created_since,
)
from ledger.services.attempts import ACCOUNT_FAILURES, ATTEMPT_RATE_LIMITED
from ledger.windows import with_estimates
from routing.drains.configs import Cap, DrainConfig, strictest
from routing.models import InboxEvent, InboxState

FAILED_STEP_STATUSES = (StepStatus.FAILED, StepStatus.TIMED_OUT)

# Step runs are created at admission and start later (a verifier waits for its worker, a step
# waits for a cooling or full account; cooldowns are capped at an hour, steps at their
# timeouts). A step that started inside a window was created at most this long before it,
# which bounds the primary-key range the time-window counts read: 9 days of steps for a
# 7-day window, not the whole history.
STEP_START_SLACK = timedelta(days=2)


# --- accounts ---------------------------------------------------------------------------------

# The overview marks an account `near window` from this used fraction on.
NEAR_WINDOW_USED = 0.75


def window_mark(windows: Sequence[Window], now: datetime) -> str | None:
    """`at window` (a window spent at the default --max-window-used), `near window` (some
    window at NEAR_WINDOW_USED or more), else None."""
    live = [w for w in windows if not w.over(now)]
    if any(w.exhausted(now, DEFAULT_MAX_WINDOW_USED) for w in live):
        return "at window"
    if any(w.used is not None and w.used >= NEAR_WINDOW_USED for w in live):
        return "near window"
    return None


@dataclass
class AccountRow:
    profile: str
    running: int = 0
    reserved: int = 0
    cap: Cap | None = None
    tool: str | None = None
    cooldown: AccountCooldown | None = None
    # Last 7 days, from the attempts (step tries) that started in the window.
    steps_24h: int = 0
    steps_7d: int = 0
    failed_7d: int = 0
    rate_limited_7d: int = 0
    breakdown: list[StepBreakdown] = field(default_factory=list)
    # The account registry's row (None: an unregistered name, as before the registry).
    registered: RegisteredAccount | None = None
    # Token usage the agents reported, over the last 5 hours and the last 7 days.
    usage_5h: UsageTotals | None = None
    usage_7d: UsageTotals | None = None
    # Its rate-limit windows: the newest observation of each, or loopsweb's estimate
    # (ledger.windows, docs/windows.md).
    windows: list[Window] = field(default_factory=list)
    # `at window` / `near window` / None, as `window_mark` says when the row was read.
    window_mark: str | None = None

    @property
    def disabled(self) -> bool:
        return self.registered is not None and not self.registered.enabled

    @property
    def load(self) -> int:
        return self.running + self.reserved

    @property
    def at_cap(self) -> bool:
        return self.cap is not None and self.load >= self.cap.limit

    def cooling(self, now: datetime) -> bool:
        return self.cooldown is not None and self.cooldown.until > now


@dataclass(frozen=True)
class UsageTotals:
    """Tokens (and cost, where the CLI reports one) of the steps that reported usage."""

    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None


@dataclass(frozen=True)
class StepBreakdown:
    role: str
    provider: str | None
    steps_24h: int
    steps_7d: int
    failed_7d: int
    rate_limited_7d: int


def account_rows(
    configs: Sequence[DrainConfig],
    *,
    now: datetime | None = None,
    with_history: bool = False,
    activity: Sequence[Mapping[str, Any]] | None = None,
) -> list[AccountRow]:
    """Every known account: load (running + reserved), cap, cooldown; with history, its
    step counts by role and provider (from `activity`, step_activity's rows, or queried
    for `now` when `with_history`).

    Accounts come from the load, the cooldown table, the pools of the drain configurations,
    the account registry and the activity; each row carries its registry entry and its
    token usage over 5 h and 7 d. Queries: account_state's one (with the windows), the cooldowns, the
    registry, the usage, and step_activity's one when it is queried here.
    """
    now = now or timezone.now()
    if activity is None and with_history:
        activity = step_activity(now=now)
    state = account_state(now=now, windows=True)
    load = state.load
    registry = account_registry()
    # A pool of registered accounts of another provider routes too: its cap is in force.
    providers = {name: entry.provider for name, entry in registry.items()}
    rows: dict[str, AccountRow] = {}

    def row(profile: str) -> AccountRow:
        if profile not in rows:
            rows[profile] = AccountRow(
                profile=profile,
                cap=strictest(
                    (c for c in configs if profile in c.pool),
                    lambda c: c.per_profile_cap(providers),
                ),
            )
        return rows[profile]

    for profile, n in load.running.items():
        row(profile).running = n
    for profile, n in load.reserved.items():
        row(profile).reserved = n
    for cooldown in AccountCooldown.objects.order_by("account_profile"):
        account = row(cooldown.account_profile)
        account.cooldown = cooldown
        account.tool = account.tool or cooldown.account_tool
    for config in configs:
        for profile in config.pool:
            row(profile)
    _add_registry_entries(row, registry)
    for profile, windows in account_usage(now=now).items():
        account = row(profile)
        account.usage_5h, account.usage_7d = windows
    # The windows came with the load; the budgets with the registry read above.
    budgets = {
        name: r.window_budgets for name, r in registry.items() if r.window_budgets
    }
    for profile, seen in with_estimates(state.windows, budgets, now).items():
        account = row(profile)
        account.windows = seen
        account.window_mark = window_mark(seen, now)
    if activity is not None:
        _add_step_breakdown(row, activity)
    return sorted(rows.values(), key=lambda r: r.profile)


def _add_registry_entries(
    row: Callable[[str], AccountRow], registry: Mapping[str, RegisteredAccount]
) -> None:
    """Give each registered account its registry entry and provider; the registry's
    running cap tightens its --max-per-profile."""
    for name, registered in registry.items():
        account = row(name)
        account.registered = registered
        account.tool = registered.provider
        limit = registered.max_running
        if limit is not None and (account.cap is None or limit < account.cap.limit):
            account.cap = Cap(
                limit=limit,
                source=DrainConfig(origin="registry", label=name, scope="", at=None),
            )


def _add_step_breakdown(
    row: Callable[[str], AccountRow], activity: Iterable[Mapping[str, Any]]
) -> None:
    """Add step_activity's rows to the accounts: step counts over 24 h and 7 d, failures
    and rate limits, in total and per (role, provider)."""
    breakdown: dict[tuple[str, str, str | None], list[int]] = {}
    for stat in activity:
        key = (stat["account_profile"], stat["step_id"], stat["account_tool"])
        sums = breakdown.setdefault(key, [0, 0, 0, 0])
        sums[0] += stat["n"] if stat["hour"] is not None else 0
        sums[1] += stat["n"]
        sums[2] += stat["failed"]
        sums[3] += stat["rate_limited"]
    for (profile, role, tool), (day, week, failed, limited) in sorted(
        breakdown.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")
    ):
        account = row(profile)
        account.tool = account.tool or tool
        account.steps_24h += day
        account.steps_7d += week
        account.failed_7d += failed
        account.rate_limited_7d += limited
        account.breakdown.append(
            StepBreakdown(
                role=role,
                provider=tool,
                steps_24h=day,
                steps_7d=week,
                failed_7d=failed,
                rate_limited_7d=limited,
            )
        )


def step_activity(*, now: datetime) -> list[dict[str, Any]]:
    """Attempts started in the last 7 days per (account, role, provider, hour).

    An attempt is one try of a step on one account (ledger.services.attempts): a step that
    hit a rate limit on one account and moved to another counts on both. Step runs with no
    attempt (recorded before attempts were) count once, on their account. Two GROUP BYs.

    `hour` is the UTC hour for attempts started in the last 24 h and NULL before, so the
    same rows give the 7-day totals, the 24-hour totals and the hourly timeline. Per row: n
    attempts; failed (failed, timed out, or failed by its account); rate_limited (the
    runner noted a provider limit).
    """
    week, day = now - timedelta(days=7), now - timedelta(hours=24)
    # Truncate the CASE, not CASE the truncation: TruncHour converts its result to an
    # aware UTC datetime on every backend; a CASE around it would not.
    hour = TruncHour(
        Case(
            When(started_at__gte=day, then=F("started_at")),
            default=None,
            output_field=DateTimeField(),
        )
    )
    attempts = (
        created_since(WorkflowStepAttempt.objects.all(), week)
        .filter(started_at__gte=week, account_profile__isnull=False)
        .annotate(hour=hour)
        .values("account_profile", "step_id", "account_tool", "hour")
        .annotate(
            n=Count("id"),
            failed=Count(
                "id", filter=Q(status__in=(*FAILED_STEP_STATUSES, *ACCOUNT_FAILURES))
            ),
            rate_limited=Count("id", filter=Q(status=ATTEMPT_RATE_LIMITED)),
        )
        .order_by()
    )
    steps = created_since(WorkflowStepRun.objects.all(), week - STEP_START_SLACK)
    legacy = (
        steps.filter(started_at__gte=week, account_profile__isnull=False)
        .exclude(Exists(WorkflowStepAttempt.objects.filter(step_run_id=OuterRef("pk"))))
        .annotate(hour=hour)
        .values("account_profile", "step_id", "account_tool", "hour")
        .annotate(
            n=Count("id"),
            failed=Count("id", filter=Q(status__in=FAILED_STEP_STATUSES)),
            rate_limited=Count("id", filter=Q(reason_code=StepReasonCode.RATE_LIMITED)),
        )
        .order_by()
    )
    return [*attempts, *legacy]


USAGE_WINDOWS = (timedelta(hours=5), timedelta(days=7))


def account_usage(*, now: datetime) -> dict[str, tuple[UsageTotals, UsageTotals]]:
    """Per account: usage of the steps that started in the last 5 hours and 7 days and
    reported usage (one GROUP BY over a primary-key range, as step_activity)."""
    short, week = (now - window for window in USAGE_WINDOWS)
    steps = created_since(WorkflowStepRun.objects.all(), week - STEP_START_SLACK)
    reported = Q(usage_input_tokens__isnull=False) | Q(
        usage_output_tokens__isnull=False
    )
    recent = Q(started_at__gte=short)
    rows = (
        steps.filter(reported, started_at__gte=week, account_profile__isnull=False)
        .values("account_profile")
        .annotate(
            n=Count("id"),
            inp=Sum("usage_input_tokens"),
            out=Sum("usage_output_tokens"),
            cached=Sum("usage_cached_tokens"),
            cost=Sum("usage_cost_usd"),
            n5=Count("id", filter=recent),
            inp5=Sum("usage_input_tokens", filter=recent),
            out5=Sum("usage_output_tokens", filter=recent),
            cached5=Sum("usage_cached_tokens", filter=recent),
            cost5=Sum("usage_cost_usd", filter=recent),
        )
        .order_by()
    )

    def totals(r: dict[str, Any], window: str) -> UsageTotals:
        # window: "5" for the last 5 hours, "" for the week
        return UsageTotals(
            steps=r[f"n{window}"],
            input_tokens=r[f"inp{window}"] or 0,
            output_tokens=r[f"out{window}"] or 0,
            cached_tokens=r[f"cached{window}"] or 0,
            cost_usd=r[f"cost{window}"],
        )

    return {r["account_profile"]: (totals(r, "5"), totals(r, "")) for r in rows}


# --- live work per route scope ----------------------------------------------------------------


@dataclass(frozen=True)
class CapRow:
    key: str | None
    active: int
    deferred: int
    cap: Cap | None

    @property
    def full(self) -> bool:
        return self.cap is not None and self.active >= self.cap.limit


_LIVE = (*ACTIVE_WORK_ITEM_STATUSES, WorkItemStatus.DEFERRED)


@dataclass(frozen=True)
class LiveCounts:
    """Live work (active and deferred items) counted per (scope, project, group, reason)."""

    route_scope: str | None
    project_key: str | None
    project_group: str | None
    reason_code: str | None
    active: int
    deferred: int
    oldest_deferred: datetime | None
    # Active items whose admission named no --max-active (the API's route, a route_event
    # without one): a drain's scope cap is shown full only over the others (/ops/).
    uncapped: int = 0


# An active item admitted without a --max-active: its stored route names none. Status first,
# so the route is read only for the (few) active rows of the live ones.
_UNCAPPED = (
    Q(status__in=ACTIVE_WORK_ITEM_STATUSES)
    & Q(route_options_json__isnull=False)
    & Q(route_options_json__options__max_active__isnull=True)
)


def live_work() -> list[LiveCounts]:
    """One pass over the live rows (status index), counted per every dimension the overview
    shows. The scope, group, project and reason tables are sums of these rows in Python: one
    read of the deferred backlog instead of four (each read is a row look-up per item)."""
    rows = (
        WorkflowWorkItem.objects.filter(status__in=_LIVE)
        .values("route_scope", "project_key", "project_group", "reason_code")
        .annotate(
            active=Count("id", filter=Q(status__in=ACTIVE_WORK_ITEM_STATUSES)),
            deferred=Count("id", filter=Q(status=WorkItemStatus.DEFERRED)),
            oldest_deferred=Min("created_at", filter=Q(status=WorkItemStatus.DEFERRED)),
            uncapped=Count("id", filter=_UNCAPPED),
        )
        .order_by()
    )
    return [LiveCounts(**row) for row in rows]


def _live_counts(column: str) -> dict[str | None, tuple[int, int]]:
    # One dimension only (for callers that need just one table, like /metrics).
    rows = (
        WorkflowWorkItem.objects.filter(status__in=_LIVE)
        .values_list(column)
        .annotate(
            active=Count("id", filter=Q(status__in=ACTIVE_WORK_ITEM_STATUSES)),
            deferred=Count("id", filter=Q(status=WorkItemStatus.DEFERRED)),
        )
        .order_by()
    )
    return {key: (active, deferred) for key, active, deferred in rows}


def live_sums(
    live: Iterable[LiveCounts] | None,
    key: Callable[[LiveCounts], str | None],
    column: str,
) -> dict[str | None, tuple[int, int]]:
    """Active and deferred per value of one dimension: summed from `live`, or queried."""
    if live is None:
        return _live_counts(column)
    sums: dict[str | None, tuple[int, int]] = {}
    for row in live:
        active, deferred = sums.get(key(row), (0, 0))
        sums[key(row)] = (active + row.active, deferred + row.deferred)
    return sums


def scope_rows(
    configs: Sequence[DrainConfig], live: Sequence[LiveCounts] | None = None
) -> list[CapRow]:
    """Each route scope with live work or a known cap: active and deferred counts, cap.

    With `live` (from live_work) no query; without, one.
    """
    counts = live_sums(live, lambda r: r.route_scope, "route_scope")
    scopes = set(counts) | {c.scope for c in configs if c.scope}
    rows = []
    for scope in scopes:
        active, deferred = counts.get(scope, (0, 0))
        cap = (
            strictest((c for c in configs if c.scope == scope), lambda c: c.max_active)
            if scope
            else None  # NULL-scope rows never count toward a scoped total
        )
        rows.append(CapRow(key=scope, active=active, deferred=deferred, cap=cap))
    return sorted(rows, key=lambda r: (r.key is None, r.key or ""))


# --- deferred work items per reason -----------------------------------------------------------


def deferred_by_reason(
    live: Sequence[LiveCounts] | None = None,
) -> dict[str | None, tuple[int, datetime | None]]:
    """Deferred work items per reason code: (how many, the oldest one's created_at).

    With `live` (from live_work) summed from it, no query; without, one GROUP BY over the
    deferred rows, in reason-code order."""
    if live is None:
        return {
            row["reason_code"]: (row["n"], row["oldest"])
            for row in WorkflowWorkItem.objects.filter(status=WorkItemStatus.DEFERRED)
            .values("reason_code")
            .annotate(n=Count("id"), oldest=Min("created_at"))
            .order_by("reason_code")
        }
    now_rows: dict[str | None, tuple[int, datetime | None]] = {}
    for row in live:
        if row.deferred:
            n, oldest = now_rows.get(row.reason_code, (0, None))
            if oldest is None or (row.oldest_deferred and row.oldest_deferred < oldest):
                oldest = row.oldest_deferred
            now_rows[row.reason_code] = (n + row.deferred, oldest)
    return now_rows


# --- inbox depth ------------------------------------------------------------------------------

# Every state an operator acts on: waiting to be routed (pending, deferred), or failed and
# needing a look. Routed history (admitted, skipped) only grows and is not counted.
INBOX_COUNTED_STATES = (InboxState.PENDING, InboxState.DEFERRED, InboxState.FAILED)


def inbox_by_state() -> dict[str, dict[str, Any]]:
    """Pending, deferred and failed inbox events (the state index), each with its oldest."""
    rows = (
        InboxEvent.objects.filter(state__in=INBOX_COUNTED_STATES)
        .values("state")
        .annotate(n=Count("id"), oldest=Min("received_at"))
        .order_by()
    )
    found = {r["state"]: r for r in rows}
    return {
        state: found.get(state, {"state": state, "n": 0, "oldest": None})
        for state in INBOX_COUNTED_STATES
    }
