"""Read-only queries behind the /ops pages: live work per project and group, deferrals, the
inbox, drains. The reads /ops shares with the API and /metrics (account rows, scope rows,
deferred items by reason, inbox depth) are in routing.selectors.

Rules these follow, so that a page's query count and cost stay flat as the ledger grows:
- Aggregate in SQL (GROUP BY with filtered counts); never one query per row shown.
- Every scan is bounded by an index: the status indexes for live work (active, deferred and
  queued rows are few next to history), the primary key for time windows (ledger ids start
  with their creation time in ms, see ledger.ids, so "created since T" is a key range even
  where the table has no timestamp index), and `idx_drains_started` for drains.
- Caps come from drain configurations (routing.drains.configs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Count,
    Max,
    Min,
    Q,
    QuerySet,
)
from django.db.models.functions import TruncHour
from django_q.models import Schedule

from agents.agent_output import knows_progress, summarize_output
from ledger.models import (
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemDeferral,
    WorkItemStatus,
)
from ledger.selectors import created_since
from routing.drains.configs import DrainConfig, strictest
from routing.models import DrainRecord, InboxEvent, InboxState
from routing.selectors import CapRow, LiveCounts, deferred_by_reason, live_sums

MAX_GROUP_ROWS = 200


# --- live work: groups, projects (scopes and live_work: routing.selectors) ---------------------


def group_rows(
    configs: Sequence[DrainConfig], live: Sequence[LiveCounts] | None = None
) -> list[CapRow]:
    """Each project group with live work, against the strictest group cap."""
    cap = strictest(configs, lambda c: c.max_active_per_project_group)
    counts = live_sums(live, lambda r: r.project_group, "project_group")
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
    counts = live_sums(live, lambda r: r.project_key, "project_key")
    busiest = sorted(
        ((k, v) for k, v in counts.items() if k is not None),
        key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]),
    )[:limit]
    return [
        CapRow(key=project, active=active, deferred=deferred, cap=cap)
        for project, (active, deferred) in busiest
    ]


@dataclass(frozen=True)
class ScopeCapRow(CapRow):
    """A route scope's row with how many of its active items were admitted without a
    --max-active (the API's route, a route_event without one): a drain's cap applies to
    what that drain admits, so it is shown full (red) only when the items admitted under
    a cap fill it. The drain still counts every active item of the scope."""

    uncapped: int = 0

    @property
    def full(self) -> bool:
        return self.cap is not None and self.active - self.uncapped >= self.cap.limit


def scope_cap_rows(
    rows: Sequence[CapRow], live: Sequence[LiveCounts]
) -> list[ScopeCapRow]:
    """`rows` (routing.selectors.scope_rows) with their uncapped active items, summed from
    `live` (routing.selectors.live_work): no query."""
    uncapped: dict[str | None, int] = {}
    for counts in live:
        uncapped[counts.route_scope] = (
            uncapped.get(counts.route_scope, 0) + counts.uncapped
        )
    return [
        ScopeCapRow(
            key=r.key,
            active=r.active,
            deferred=r.deferred,
            cap=r.cap,
            uncapped=uncapped.get(r.key, 0) if r.cap is not None else 0,
        )
        for r in rows
    ]


# --- deferrals --------------------------------------------------------------------------------


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
    now_rows = deferred_by_reason(live)
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


# The inbox deliveries a work-item page lists (the /ops/ item page and the admin's, which
# routing adds to it: routing.admin).
INBOX_SHOWN = 20


def item_inbox_events(item_id: str, *, limit: int = INBOX_SHOWN) -> list[InboxEvent]:
    """The inbox events that produced the item, oldest first, without their payloads."""
    return list(
        InboxEvent.objects.filter(work_item_id=item_id)
        .order_by("received_at")
        .defer("data", "metadata")[:limit]
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


def drain_of_inbox_event(row: InboxEvent, *, look_back: int = 10) -> DrainRecord | None:
    """The drain that last recorded an outcome on this inbox row: among the latest drains
    that started before its `routed_at` (idx_drains_started), the first whose results name
    the event. None when it was routed by the API (`route=now`) or its drain was pruned."""
    if row.routed_at is None:
        return None
    for record in DrainRecord.objects.filter(
        started_at__lte=row.routed_at, dry_run=False
    ).order_by("-started_at")[:look_back]:
        results = record.results_json if isinstance(record.results_json, list) else []
        if any(
            isinstance(r, dict) and r.get("eventId") == row.event_id for r in results
        ):
            return record
    return None


# --- what runs now, what waits for an account ------------------------------------------------


@dataclass(frozen=True)
class LiveStep:
    step_id: str
    account_profile: str | None
    account_tool: str | None
    run_id: str
    work_item_id: str | None
    subject: str
    since: datetime | None
    why: str = ""
    code: str = ""
    now: str = ""  # what a running step printed last, readable (agents.agent_output)
    # When a running agent last made progress (None: not yet); only for the CLIs whose
    # output tells progress apart (`tracks_progress`).
    progress_at: datetime | None = None
    tracks_progress: bool = False


# The columns a LiveStep needs from a step, its run and its item (one join, no more).
_LIVE_STEP_FIELDS = (
    "step_id",
    "account_profile",
    "account_tool",
    "workflow_run__id",
    "workflow_run__work_item__id",
    "workflow_run__work_item__subject_ref",
)


def _live_steps(
    steps: QuerySet[WorkflowStepRun], *extra: str
) -> QuerySet[WorkflowStepRun]:
    return steps.select_related("workflow_run__work_item").only(
        *_LIVE_STEP_FIELDS, *extra
    )


def _live_step(
    step: WorkflowStepRun, *, since: datetime | None, why: str = "", code: str = ""
) -> LiveStep:
    """One row of the running/waiting tables; `step` comes from `_live_steps`."""
    run = step.workflow_run
    return LiveStep(
        step_id=step.step_id,
        account_profile=step.account_profile,
        account_tool=step.account_tool,
        run_id=run.id,
        work_item_id=run.work_item_id,
        subject=run.work_item.subject_ref if run.work_item else run.id,
        since=since,
        why=why,
        code=code,
    )


def last_output_line(step: WorkflowStepRun) -> str:
    """The last readable line of a step's output so far (the runner writes the tails every
    LOOPSWEB_OUTPUT_FLUSH_SECONDS while it runs): one line per agent event for the
    JSON-speaking CLIs, else the last line printed."""
    for text in (step.stdout, step.stderr):
        lines = summarize_output(step.account_tool, text or "").splitlines()
        if lines:
            return lines[-1]
    return ""


def running_steps(*, limit: int = 50) -> list[LiveStep]:
    """Steps running now (the step status index), oldest start first, with their item and
    what each printed last."""
    rows = _live_steps(
        WorkflowStepRun.objects.filter(status=StepStatus.RUNNING),
        "started_at",
        "stdout",
        "stderr",
        "progress_at",
    ).order_by("started_at")[:limit]
    return [
        replace(
            _live_step(s, since=s.started_at),
            now=last_output_line(s),
            progress_at=s.progress_at,
            tracks_progress=knows_progress(s.account_tool),
        )
        for s in rows
    ]


# A pending step waits for its account; a failed one for its pool to cool
# (ledger/services/failover.py, "a whole-pool limit waits").
STEP_WAITING_STATUSES = (StepStatus.PENDING, StepStatus.FAILED, StepStatus.TIMED_OUT)


def waiting_steps(*, limit: int = 50) -> list[LiveStep]:
    """Steps whose run is running but which wait for their account (at its cap or cooling):
    pending steps of running runs that have a `step_waiting` event, with that event's reason
    and time, and failed steps waiting to run again (a whole pool rate limited: a
    `step_waiting` event since they finished). Two queries: the steps (step status index),
    their waiting events (the run's event key)."""
    pending = list(
        _live_steps(
            WorkflowStepRun.objects.filter(
                status__in=STEP_WAITING_STATUSES,
                workflow_run__status=RunStatus.RUNNING,
            ),
            "status",
            "finished_at",
        ).order_by("workflow_run_id", "sequence")[: limit * 4]
    )
    if not pending:
        return []
    latest: dict[tuple[str, str], WorkflowEvent] = {}
    for found in WorkflowEvent.objects.filter(
        workflow_run_id__in={s.workflow_run_id for s in pending},
        event_type="step_waiting",
    ).order_by("workflow_run_id", "-sequence"):
        latest.setdefault((found.workflow_run_id, found.step_id or ""), found)
    rows = []
    for s in pending:
        event = latest.get((s.workflow_run_id, s.step_id))
        if event is None:
            continue  # not started yet because an earlier step runs, not waiting
        if s.status != StepStatus.PENDING and (
            s.finished_at is None or event.created_at < s.finished_at
        ):
            continue  # a failed step that waits for nothing (its run is ending)
        payload = event.payload_json if isinstance(event.payload_json, dict) else {}
        rows.append(
            _live_step(
                s,
                since=event.created_at,
                why=str(payload.get("reason") or ""),
                code=str(payload.get("code") or ""),
            )
        )
    rows.sort(key=lambda r: (r.since is None, r.since))
    return rows[:limit]


# --- throughput, schedules (inbox by state: routing.selectors) -------------------------------

SUCCESS_RUN_STATUSES = (RunStatus.SUCCEEDED,)
FAILURE_RUN_STATUSES = (RunStatus.FAILED, RunStatus.TIMED_OUT)


def run_throughput(
    *, now: datetime, hours: int = 24
) -> dict[datetime, tuple[int, int]]:
    """Runs finished per hour over the last `hours`: (succeeded, failed or timed out).

    A key range on the run id (runs created in the last 2 × hours: a run finishes within
    its timeout, far less than a day) then the finish time, grouped by hour in SQL."""
    since = now - timedelta(hours=hours)
    rows = (
        created_since(WorkflowRun.objects.all(), now - timedelta(hours=2 * hours))
        .filter(
            finished_at__gte=since,
            status__in=(*SUCCESS_RUN_STATUSES, *FAILURE_RUN_STATUSES),
        )
        .annotate(hour=TruncHour("finished_at"))
        .values("hour")
        .annotate(
            ok=Count("id", filter=Q(status__in=SUCCESS_RUN_STATUSES)),
            bad=Count("id", filter=Q(status__in=FAILURE_RUN_STATUSES)),
        )
        .order_by()
    )
    return {r["hour"]: (r["ok"], r["bad"]) for r in rows if r["hour"] is not None}


@dataclass(frozen=True)
class OverdueSchedule:
    id: int
    name: str
    func: str
    next_run: datetime
    repeats: int


# django-q2 looks at schedules every 30 s: a schedule later than this was missed.
OVERDUE_AFTER = timedelta(seconds=90)
OVERDUE_SHOWN = 50


def overdue_schedules(*, now: datetime) -> list[OverdueSchedule]:
    """django-q2 schedules whose next run is more than OVERDUE_AFTER in the past: no
    qcluster is picking them up (or it is overloaded). Paused schedules (repeats 0) are not
    overdue. The OVERDUE_SHOWN most overdue, most overdue first; one query. (The table also
    holds one row per run waiting out a retry backoff, so it is never read whole.)"""
    rows = (
        Schedule.objects.filter(next_run__lt=now - OVERDUE_AFTER)
        .exclude(repeats=0)
        .order_by("next_run")
        .values("id", "name", "func", "next_run", "repeats")[:OVERDUE_SHOWN]
    )
    return [OverdueSchedule(**{**r, "name": r["name"] or r["func"]}) for r in rows]
