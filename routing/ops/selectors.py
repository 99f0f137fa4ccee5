"""Read-only queries behind the /ops pages and the ledger admin's filters.

Rules these follow, so that a page's query count and cost stay flat as the ledger grows:
- Aggregate in SQL (GROUP BY with filtered counts); never one query per row shown.
- Every scan is bounded by an index: the status indexes for live work (active, deferred and
  queued rows are few next to history), the primary key for time windows (ledger ids start
  with their creation time in ms, see ledger.ids, so "created since T" is a key range even
  where the table has no timestamp index), and `idx_drains_started` for drains.
- Caps are not stored anywhere as such: they are options of drains. The caps shown are read
  from the drain schedules and from the latest real drain of each route scope.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    F,
    Max,
    Min,
    Model,
    Q,
    QuerySet,
    When,
    Window,
)
from django.db.models.functions import RowNumber, TruncHour
from django.utils import timezone
from django_q.models import Schedule

from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    AccountCooldown,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemDeferral,
    WorkItemStatus,
)
from ledger.runner import RATE_LIMIT_NOTE
from ledger.selectors import account_load
from routing.domain.templates import parse_pool, pool_routing_active
from routing.models import DrainRecord, InboxEvent, InboxState
from routing.services import DEFAULT_MAX_PER_PROFILE, PIN_OPTIONS

# The django-q2 function every scheduled drain runs (routing.management.commands.schedule_drain).
DRAIN_FUNC = "routing.tasks.drain"
# Drains older than this no longer say what the caps are (a scope that has not drained for a
# month shows "no cap" unless a schedule names one). Bounds the latest-drain-per-scope scan.
CAP_LOOKBACK = timedelta(days=30)
# Step runs are created at admission and start later (a verifier waits for its worker, a step
# waits for a cooling or full account; cooldowns are capped at an hour, steps at their
# timeouts). A step that started inside a window was created at most this long before it,
# which bounds the primary-key range the time-window counts read: 9 days of steps for a
# 7-day window, not the whole history.
STEP_START_SLACK = timedelta(days=2)
# The runner appends this to the error of a step that hit a provider rate limit.
RATE_LIMIT_MARK = RATE_LIMIT_NOTE.split(":")[0].strip("; ")
FAILED_STEP_STATUSES = (StepStatus.FAILED, StepStatus.TIMED_OUT)
MAX_GROUP_ROWS = 200


def id_floor(moment: datetime) -> str:
    """The smallest ledger id created at or after `moment` (ids start with their ms time)."""
    return f"{int(moment.timestamp() * 1000) & 0xFFFFFFFFFFFF:012x}"


def created_since(queryset: QuerySet[Any], moment: datetime) -> QuerySet[Any]:
    """Rows created at or after `moment`, as a primary-key range (see the module docstring)."""
    return queryset.filter(pk__gte=id_floor(moment))


def created_before(queryset: QuerySet[Any], moment: datetime) -> QuerySet[Any]:
    return queryset.filter(pk__lt=id_floor(moment))


def distinct_values(
    model: type[Model], field_name: str, *, limit: int = 100
) -> list[str]:
    """Up to `limit` distinct non-NULL values of an indexed column, smallest first.

    A loose index scan (a recursive CTE that jumps to the next larger value) costs one index
    probe per distinct value, where `SELECT DISTINCT` reads every row: the difference between
    a millisecond and a second on a million work items. Portable to SQLite and PostgreSQL.
    """
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    column = qn(model._meta.get_field(field_name).column)
    sql = (
        f"WITH RECURSIVE vals(v) AS ("
        f" SELECT MIN({column}) FROM {table}"
        f" UNION ALL"
        f" SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > vals.v)"
        f" FROM vals WHERE vals.v IS NOT NULL"
        f") SELECT v FROM vals WHERE v IS NOT NULL LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


# --- caps from drain configurations -----------------------------------------------------------


@dataclass(frozen=True)
class DrainConfig:
    """The caps one drain configuration applies: a schedule, or the latest drain of a scope."""

    origin: str  # "schedule" or "drain"
    label: str  # the schedule's name, or the drain record's id
    scope: str
    at: datetime | None
    max_active: int | None = None
    max_active_per_project: int | None = None
    max_active_per_project_group: int | None = None
    pool: tuple[str, ...] = ()
    # Effective --max-per-profile: None when it does not apply (no pool routing, or 0).
    max_per_profile: int | None = None


@dataclass(frozen=True)
class Cap:
    limit: int
    source: DrainConfig


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def drain_config(
    *,
    origin: str,
    label: str,
    scope: str,
    at: datetime | None,
    options: Mapping[str, Any],
) -> DrainConfig:
    """A DrainConfig from stored drain options (`DrainOptions.to_dict()` shape)."""
    raw_pool = options.get("auth_profile_pool")
    pool = (
        [str(p).strip() for p in raw_pool if str(p).strip()]
        if isinstance(raw_pool, (list, tuple))
        else parse_pool(raw_pool if isinstance(raw_pool, str) else None)
    )
    provider = options.get("provider") or "codewith"
    pins = {
        role: options.get(flag) if isinstance(options.get(flag), str) else None
        for flag, role in PIN_OPTIONS.items()
    }
    per_profile = _int(options.get("max_per_profile"))
    if pool_routing_active(provider=provider, pool=pool, pins=pins):
        if per_profile is None:
            per_profile = DEFAULT_MAX_PER_PROFILE  # what admission applies to a pool
        effective = per_profile or None  # 0 disables the guard
    else:
        effective = None
    return DrainConfig(
        origin=origin,
        label=label,
        scope=scope,
        at=at,
        max_active=_int(options.get("max_active")),
        max_active_per_project=_int(options.get("max_active_per_project")),
        max_active_per_project_group=_int(options.get("max_active_per_project_group")),
        pool=tuple(pool),
        max_per_profile=effective,
    )


def _schedule_kwargs(text: str | None) -> dict[str, Any]:
    # schedule_drain stores repr() of a dict of plain literals; never eval anything else.
    try:
        value = ast.literal_eval(text or "{}")
    except (ValueError, SyntaxError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class ScheduledDrain:
    name: str
    kind: str | None
    every_minutes: int | None
    cron: str | None
    next_run: datetime | None
    options: dict[str, Any]


def scheduled_drains() -> list[ScheduledDrain]:
    """Every drain schedule (django-q2 rows made by `schedule_drain`), by name. One query."""
    out = []
    for schedule in Schedule.objects.filter(func=DRAIN_FUNC).order_by("name"):
        kwargs = _schedule_kwargs(schedule.kwargs)
        options = kwargs.get("options")
        out.append(
            ScheduledDrain(
                name=schedule.name or "",
                kind=kwargs.get("kind"),
                every_minutes=schedule.minutes
                if schedule.schedule_type == Schedule.MINUTES
                else None,
                cron=schedule.cron,
                next_run=schedule.next_run,
                options=options if isinstance(options, dict) else {},
            )
        )
    return out


def drain_configs(
    *, now: datetime, schedules: Sequence[ScheduledDrain] | None = None
) -> list[DrainConfig]:
    """Schedules first, then the latest real drain of each route scope in CAP_LOOKBACK.

    Two queries (one when `schedules` is given): the schedules, and one window query that
    keeps the newest drain record per scope.
    """
    configs = []
    for schedule in scheduled_drains() if schedules is None else schedules:
        scope = schedule.options.get("max_active_scope") or schedule.name
        configs.append(
            drain_config(
                origin="schedule",
                label=schedule.name,
                scope=str(scope),
                at=schedule.next_run,
                options=schedule.options,
            )
        )
    latest = (
        DrainRecord.objects.filter(dry_run=False, started_at__gte=now - CAP_LOOKBACK)
        .annotate(
            newest=Window(
                RowNumber(),
                partition_by=[F("route_scope")],
                order_by=F("started_at").desc(),
            )
        )
        .filter(newest=1)
        .values_list("id", "route_scope", "started_at", "options_json")
    )
    for record_id, scope, started_at, options in latest:
        configs.append(
            drain_config(
                origin="drain",
                label=record_id,
                scope=scope or "",
                at=started_at,
                options=options if isinstance(options, dict) else {},
            )
        )
    return configs


def strictest(
    configs: Iterable[DrainConfig], limit_of: Callable[[DrainConfig], int | None]
) -> Cap | None:
    """The smallest limit any configuration applies (admission defers at the strictest)."""
    best: Cap | None = None
    for config in configs:
        limit = limit_of(config)
        if limit is not None and (best is None or limit < best.limit):
            best = Cap(limit=limit, source=config)
    return best


# --- live work: scopes, groups, projects ------------------------------------------------------


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


def _sum_by(
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
    counts = _sum_by(live, lambda r: r.route_scope, "route_scope")
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


def group_rows(
    configs: Sequence[DrainConfig], live: Sequence[LiveCounts] | None = None
) -> list[CapRow]:
    """Each project group with live work, against the strictest group cap."""
    cap = strictest(configs, lambda c: c.max_active_per_project_group)
    counts = _sum_by(live, lambda r: r.project_group, "project_group")
    return [
        CapRow(key=group, active=active, deferred=deferred, cap=cap)
        for group, (active, deferred) in sorted(
            (k, v) for k, v in counts.items() if k is not None
        )[:MAX_GROUP_ROWS]
    ]


def project_rows(
    configs: Sequence[DrainConfig],
    live: Sequence[LiveCounts] | None = None,
    *,
    limit: int = 20,
) -> list[CapRow]:
    """The busiest projects (most active, then most deferred), against the project cap."""
    cap = strictest(configs, lambda c: c.max_active_per_project)
    counts = _sum_by(live, lambda r: r.project_key, "project_key")
    busiest = sorted(
        ((k, v) for k, v in counts.items() if k is not None),
        key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]),
    )[:limit]
    return [
        CapRow(key=project, active=active, deferred=deferred, cap=cap)
        for project, (active, deferred) in busiest
    ]


# --- accounts ---------------------------------------------------------------------------------


@dataclass
class AccountRow:
    profile: str
    running: int = 0
    reserved: int = 0
    cap: Cap | None = None
    tool: str | None = None
    cooldown: AccountCooldown | None = None
    # Last 7 days, from step runs that started in the window.
    steps_24h: int = 0
    steps_7d: int = 0
    failed_7d: int = 0
    rate_limited_7d: int = 0
    breakdown: list[StepBreakdown] = field(default_factory=list)

    @property
    def load(self) -> int:
        return self.running + self.reserved

    @property
    def at_cap(self) -> bool:
        return self.cap is not None and self.load >= self.cap.limit

    def cooling(self, now: datetime) -> bool:
        return self.cooldown is not None and self.cooldown.until > now


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

    Accounts come from the load, the cooldown table, the pools of the drain configurations
    and the activity. Queries: account_load's one, the cooldowns, and step_activity's one
    when it is queried here.
    """
    if activity is None and with_history:
        activity = step_activity(now=now or timezone.now())
    load = account_load()
    rows: dict[str, AccountRow] = {}

    def row(profile: str) -> AccountRow:
        if profile not in rows:
            rows[profile] = AccountRow(
                profile=profile,
                cap=strictest(
                    (c for c in configs if profile in c.pool),
                    lambda c: c.max_per_profile,
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
    if activity is not None:
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
    return sorted(rows.values(), key=lambda r: r.profile)


def step_activity(*, now: datetime) -> list[dict[str, Any]]:
    """Steps started in the last 7 days per (account, role, provider, hour), one GROUP BY.

    `hour` is the UTC hour for steps started in the last 24 h and NULL before, so the same
    rows give the 7-day totals, the 24-hour totals and the hourly timeline. Per row: n
    steps; failed (failed or timed out); rate_limited (the runner noted a provider limit).
    """
    week, day = now - timedelta(days=7), now - timedelta(hours=24)
    steps = created_since(WorkflowStepRun.objects.all(), week - STEP_START_SLACK)
    return list(
        steps.filter(started_at__gte=week, account_profile__isnull=False)
        .annotate(
            # Truncate the CASE, not CASE the truncation: TruncHour converts its result to
            # an aware UTC datetime on every backend; a CASE around it would not.
            hour=TruncHour(
                Case(
                    When(started_at__gte=day, then=F("started_at")),
                    default=None,
                    output_field=DateTimeField(),
                )
            )
        )
        .values("account_profile", "step_id", "account_tool", "hour")
        .annotate(
            n=Count("id"),
            failed=Count("id", filter=Q(status__in=FAILED_STEP_STATUSES)),
            rate_limited=Count("id", filter=Q(error__contains=RATE_LIMIT_MARK)),
        )
        .order_by()
    )


def timeline_hours(now: datetime) -> list[datetime]:
    """The 24 UTC hour buckets ending with the current one, oldest first."""
    current = now.replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=23 - i) for i in range(24)]


# --- deferrals --------------------------------------------------------------------------------


def deferred_by_reason() -> list[dict[str, Any]]:
    """Deferred work items per reason code (n), and the oldest one's created_at (oldest)."""
    return list(
        WorkflowWorkItem.objects.filter(status=WorkItemStatus.DEFERRED)
        .values("reason_code")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .order_by("reason_code")
    )


@dataclass(frozen=True)
class ReasonRow:
    code: str | None
    deferred: int  # items deferred now
    oldest: datetime | None  # created_at of the oldest of them
    decisions: int  # deferral decisions recorded in the window
    items: int  # distinct items those decisions were about


def reason_rows(*, since: datetime, live: Sequence[LiveCounts]) -> list[ReasonRow]:
    """Per reason code: items deferred now (from `live`), and the deferral decisions
    recorded since `since` (one key-range query)."""
    now_rows: dict[str | None, tuple[int, datetime | None]] = {}
    for row in live:
        if row.deferred:
            n, oldest = now_rows.get(row.reason_code, (0, None))
            if oldest is None or (row.oldest_deferred and row.oldest_deferred < oldest):
                oldest = row.oldest_deferred
            now_rows[row.reason_code] = (n + row.deferred, oldest)
    window = {r["reason_code"]: r for r in deferral_events_by_reason(since=since)}
    rows = [
        ReasonRow(
            code=code,
            deferred=now_rows.get(code, (0, None))[0],
            oldest=now_rows.get(code, (0, None))[1],
            decisions=window.get(code, {}).get("n", 0),
            items=window.get(code, {}).get("items", 0),
        )
        for code in set(now_rows) | set(window)
    ]
    return sorted(rows, key=lambda r: (-r.deferred, -r.decisions, r.code or ""))


def deferral_events_by_reason(*, since: datetime) -> list[dict[str, Any]]:
    """Deferral decisions recorded since `since`, per reason code (a key-range scan)."""
    return list(
        created_since(WorkItemDeferral.objects.all(), since)
        .filter(created_at__gte=since)
        .values("reason_code")
        .annotate(n=Count("id"), items=Count("work_item", distinct=True))
        .order_by("reason_code")
    )


def deferred_groups(*, limit: int = MAX_GROUP_ROWS) -> list[dict[str, Any]]:
    """Deferred items grouped by (reason code, route scope, project), longest waiting first."""
    return list(
        WorkflowWorkItem.objects.filter(status=WorkItemStatus.DEFERRED)
        .values("reason_code", "route_scope", "project_key")
        .annotate(n=Count("id"), oldest=Min("created_at"), last=Max("updated_at"))
        .order_by("oldest", "reason_code", "route_scope", "project_key")[:limit]
    )


def deferred_items(
    *,
    reason_code: str | None = None,
    route_scope: str | None = None,
    project_key: str | None = None,
) -> QuerySet[WorkflowWorkItem]:
    """Deferred items in the order a drain reconsiders them (the status_next index order)."""
    items = WorkflowWorkItem.objects.filter(status=WorkItemStatus.DEFERRED)
    if reason_code:
        items = items.filter(reason_code=reason_code)
    if route_scope:
        items = items.filter(route_scope=route_scope)
    if project_key:
        items = items.filter(project_key=project_key)
    return items.order_by("next_attempt_at", "-priority", "created_at").only(
        "id",
        "route_key",
        "route_scope",
        "project_key",
        "project_group",
        "subject_ref",
        "reason_code",
        "last_reason",
        "attempts",
        "created_at",
        "updated_at",
    )


def deferred_inbox_by_reason() -> list[dict[str, Any]]:
    return list(
        InboxEvent.objects.filter(state=InboxState.DEFERRED)
        .values("reason_code")
        .annotate(n=Count("id"), oldest=Min("received_at"))
        .order_by("reason_code")
    )


def oldest_deferred_inbox(*, limit: int = 20) -> list[InboxEvent]:
    return list(
        InboxEvent.objects.filter(state=InboxState.DEFERRED)
        .order_by("received_at")
        .defer("data", "metadata")[:limit]
    )


def inbox_depth() -> dict[str, dict[str, Any]]:
    """Open inbox events (pending, deferred) per state, with the oldest receive time."""
    rows = (
        InboxEvent.objects.filter(state__in=(InboxState.PENDING, InboxState.DEFERRED))
        .values("state")
        .annotate(n=Count("id"), oldest=Min("received_at"))
        .order_by()
    )
    return {r["state"]: r for r in rows}


def work_item_runs(item_id: str, *, limit: int = 20) -> list[WorkflowRun]:
    return list(
        WorkflowRun.objects.filter(work_item_id=item_id)
        .order_by("-id")
        .only(
            "id",
            "workflow_name",
            "status",
            "started_at",
            "finished_at",
            "created_at",
            "error",
        )[:limit]
    )


# --- drains -----------------------------------------------------------------------------------


def latest_drains() -> QuerySet[DrainRecord]:
    """Drain records newest first, without their (large) results and options."""
    return DrainRecord.objects.order_by("-started_at").defer(
        "results_json", "options_json"
    )


def work_item_statuses(ids: Iterable[str]) -> dict[str, str]:
    wanted = {i for i in ids if i}
    if not wanted:
        return {}
    return dict(
        WorkflowWorkItem.objects.filter(pk__in=wanted).values_list("id", "status")
    )
