"""Batched admission: up to K drain candidates decided in one transaction, one lock hold.

The decisions are exactly those of one-at-a-time routing (`run._route_one`): candidates are
taken in the same order and each sees the counts as the ones before it left them. What
changes is how often the database is asked:
  - the admission lock, the rows an admission may reuse, the cap counts and the account loads
    are read once per batch; counts and loads are then updated in memory as candidates are
    admitted (safe: every writer that raises a count holds the same lock; writers that lower
    one without it, a finishing step, only make the kept view conservative for this batch);
  - the new rows (invocations, specs, loops, items, runs, step runs, events) are written with
    one bulk INSERT per table, the account loads with one upsert, the inbox rows with one
    claim and at most two record UPDATEs.
A candidate that meets existing rows (an item seen before, a reused invocation or spec) is
admitted the one-at-a-time way (`_admit`), in the same transaction, after the rows decided
before it are written; the counts are read again after it.

The batch owns its inbox rows before it decides anything: right after the admission lock it
reads, in one statement, which of its rows are still as the drain scanned them (open, same
attempt counter), locking them on PostgreSQL (`FOR UPDATE`; on SQLite `BEGIN IMMEDIATE`
already holds the database's write lock). A row another drain took since the scan is lost
to this drain, as one-at-a-time routing finds when its claim fails: it gets no admission and
no write; only a hold the row already records is still reported (one at a time decides the
pre-check before it claims, and such a hold writes nothing). The rows it owns are recorded,
attempt counter included, with at most two UPDATEs at the end.

A failure anywhere rolls the whole batch back: it never writes part of a batch, and its rows
stay as they were (open, for this drain one at a time or a later drain). After an error the
drain routes candidates one at a time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from domain import reasons
from domain.templates import apply_pool_profiles
from domain.throttle import (
    AdmissionDecision,
    ThrottleCounts,
    admission_decision,
)
from ledger.loads import LoadDelta, apply_load_delta
from ledger.lock import admission_lock
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    KEEP_WORK_ITEM_STATUSES,
    Loop,
    SpecStatus,
    WorkflowEvent,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.queue import enqueue_run_workflow
from ledger.selectors import account_registry, account_state
from ledger.services import work_item_admit_rows
from routing.admission import (
    CREATED,
    THROTTLED,
    PoolView,
    RoutePlan,
    RouteResult,
    check_plan_fits_columns,
)
from routing.admission.transaction import (
    _admit,
    _work_item_upsert,
    admitted_reason,
    loop_description,
    new_invocation,
    new_spec,
    pool_view,
)
from routing.drains.outcomes import _INBOX_STATE, _claim, _hold_record
from routing.drains.sources import Candidate
from routing.models import OPEN_INBOX_STATES, InboxEvent, InboxState


@dataclass
class _Rows:
    """Existing rows the batch's plans would meet: item status by idempotency key, event
    invocations by dedupe key, active spec names."""

    items: dict[str, str] = field(default_factory=dict)
    invocations: set[str] = field(default_factory=set)
    specs: set[str] = field(default_factory=set)


def _existing_rows(plans: Sequence[RoutePlan]) -> _Rows:
    rows = _Rows()
    by_route: dict[str, list[str]] = defaultdict(list)
    for plan in plans:
        by_route[plan.route_key].append(plan.idempotency_key)
    for route_key, keys in by_route.items():
        rows.items.update(
            WorkflowWorkItem.objects.filter(
                route_key=route_key, idempotency_key__in=keys
            ).values_list("idempotency_key", "status")
        )
    rows.invocations = set(
        WorkflowInvocation.objects.filter(
            source_kind="event",
            source_dedupe_key__in=[p.idempotency_key for p in plans],
        ).values_list("source_dedupe_key", flat=True)
    )
    rows.specs = set(
        WorkflowSpec.objects.filter(
            status=SpecStatus.ACTIVE, name__in=[p.workflow_name for p in plans]
        ).values_list("name", flat=True)
    )
    return rows


_ITEMS = WorkflowWorkItem._meta.db_table


class _Counts:
    """Active items per scope, project and group (as `ledger.selectors.active_counts`),
    read once for a batch's plans and kept up to date in memory."""

    def __init__(self, plans: Sequence[RoutePlan]) -> None:
        self.scope: dict[str, int] = {}
        self.project: dict[str, int] = {}
        self.group: dict[str, int] = {}
        active = [str(s) for s in ACTIVE_WORK_ITEM_STATUSES]
        where = f'"status" IN ({", ".join(["%s"] * len(active))})'
        parts: list[str] = []
        params: list[object] = []
        for scope in sorted({p.scope or "" for p in plans}):
            if scope:  # NULL-scope rows never count toward a scoped total
                parts.append(
                    f"SELECT 's', %s, COUNT(*) FROM \"{_ITEMS}\" "
                    f'WHERE {where} AND "route_scope" = %s'
                )
                params += [scope, *active, scope]
            else:  # no scope: every active item (upstream's unscoped global count)
                parts.append(
                    f"SELECT 's', %s, COUNT(*) FROM \"{_ITEMS}\" WHERE {where}"
                )
                params += [scope, *active]
        for kind, column, values in (
            ("p", "project_key", {p.project_path for p in plans if p.project_path}),
            ("g", "project_group", {p.project_group for p in plans if p.project_group}),
        ):
            if values:
                marks = ", ".join(["%s"] * len(values))
                parts.append(
                    f'SELECT \'{kind}\', "{column}", COUNT(*) FROM "{_ITEMS}" '
                    f'WHERE {where} AND "{column}" IN ({marks}) GROUP BY "{column}"'
                )
                params += [*active, *sorted(values)]
        with connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join(parts), params)
            for kind, key, n in cursor.fetchall():
                {"s": self.scope, "p": self.project, "g": self.group}[kind][key] = n

    def of(self, plan: RoutePlan) -> ThrottleCounts:
        return ThrottleCounts(
            scope=self.scope.get(plan.scope or "", 0),
            project=self.project.get(plan.project_path, 0) if plan.project_path else 0,
            project_group=self.group.get(plan.project_group, 0)
            if plan.project_group
            else None,
        )

    def admitted(self, plan: RoutePlan) -> None:
        self.scope[plan.scope or ""] = self.scope.get(plan.scope or "", 0) + 1
        if plan.project_path:
            self.project[plan.project_path] = self.project.get(plan.project_path, 0) + 1
        if plan.project_group:
            self.group[plan.project_group] = self.group.get(plan.project_group, 0) + 1


class _Loads:
    """Account loads and cooldowns (as `ledger.selectors.account_state`), kept in memory."""

    def __init__(self, now: datetime) -> None:
        state = account_state(now=now)
        self.total: dict[str, int] = state.load.total()
        self.cooling = state.cooling
        self.registry = account_registry()  # the registry is small: read it whole, once

    def view(self, plan: RoutePlan) -> PoolView:
        # As `routing.admission.pool_assignment_now`, from the loads in memory.
        return pool_view(
            plan,
            loads=dict(self.total),
            cooling=self.cooling,
            registry=self.registry,
        )

    def add(self, delta: LoadDelta) -> None:
        for counter in (delta.running, delta.reserved):
            for account, n in counter.items():
                self.total[account] = self.total.get(account, 0) + n


@dataclass
class _Pending:
    """Rows decided but not yet written (flushed in bulk, parents first)."""

    invocations: list[WorkflowInvocation] = field(default_factory=list)
    specs: list[WorkflowSpec] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    items: list[WorkflowWorkItem] = field(default_factory=list)
    runs: list[WorkflowRun] = field(default_factory=list)
    steps: list[WorkflowStepRun] = field(default_factory=list)
    events: list[WorkflowEvent] = field(default_factory=list)
    load: LoadDelta = field(default_factory=LoadDelta)

    def flush(self) -> None:
        for model, rows in (
            (WorkflowInvocation, self.invocations),
            (WorkflowSpec, self.specs),
            (Loop, self.loops),
            (WorkflowWorkItem, self.items),
            (WorkflowRun, self.runs),
            (WorkflowStepRun, self.steps),
            (WorkflowEvent, self.events),
        ):
            if rows:
                model.objects.bulk_create(rows)  # type: ignore[attr-defined]
                rows.clear()
        apply_load_delta(self.load)
        self.load = LoadDelta()


@dataclass
class Decided:
    """One candidate's outcome: its result dict and what its inbox row should record."""

    candidate: Candidate
    result: dict[str, Any]
    hold: tuple[str, str] | None = None  # (reason, code) of a hold
    routed: RouteResult | None = None


class _Seen:
    """The cap counts and account loads a batch decides from: read on first need, then
    kept in memory as it admits."""

    def __init__(self, plans: Sequence[RoutePlan], now: datetime) -> None:
        self.plans = plans
        self.now = now
        self._counts: _Counts | None = None
        self._loads: _Loads | None = None

    def counts(self) -> _Counts:
        if self._counts is None:
            self._counts = _Counts(self.plans)
        return self._counts

    def loads(self) -> _Loads:
        if self._loads is None:
            self._loads = _Loads(self.now)
        return self._loads

    def admitted(self, plan: RoutePlan, load: LoadDelta) -> None:
        if self._counts is not None:
            self._counts.admitted(plan)
        if self._loads is not None:
            self._loads.add(load)

    def forget(self) -> None:
        self._counts = self._loads = None


def _precheck(
    plan: RoutePlan, full: Any, seen: _Seen
) -> tuple[tuple[str, str] | None, AdmissionDecision | None, PoolView | None]:
    """The pre-check of one-at-a-time routing, from the counts in memory: the hold
    (reason, code) or None, and the throttle decision and pool view it made."""
    hold = full.held(plan)
    decision: AdmissionDecision | None = None
    view: PoolView | None = None
    if hold is None and plan.limits.any_set:
        decision = admission_decision(
            scope=plan.scope,
            project_path=plan.project_path,
            project_group=plan.project_group,
            counts=seen.counts().of(plan),
            limits=plan.limits,
        )
        if not decision.allowed:
            hold = (decision.reason or "", decision.reason_code or reasons.ROUTE_CAP)
    if hold is None and plan.pool_active:
        view = seen.loads().view(plan)
        if view.assignment.deferred:
            hold = (
                view.deferral_reason,
                view.assignment.reason_code or reasons.PROFILE_CAP,
            )
    return hold, decision, view


def route_batch(
    pairs: Sequence[tuple[Candidate, RoutePlan]],
    *,
    now: datetime,
    full: Any,
    shared_pool: bool,
    held: Any,
    max_created: int,
) -> list[Decided | None]:
    """Decide and write `pairs` in order (module docstring).

    `full` is the drain's `_Full` (caps seen full), updated as one-at-a-time routing would;
    `held(envelope, reason, code, plan)` builds a hold's result. Returns the outcomes of the
    candidates it decided, None for one whose inbox row another drain took since the scan:
    all of them, or those up to the one that made the `max_created`th admission (the drain's
    max_dispatch), or those before the one that found the scope (or a shared pool) full,
    which the drain then holds unread. An error propagates with nothing written.
    """
    holds = _all_held(pairs, now=now, full=full, shared_pool=shared_pool, held=held)
    if holds is not None:
        return _record_holds(holds, now)
    decided: list[Decided | None] = []
    with transaction.atomic():
        admission_lock()
        owned = _own_inbox_rows([candidate for candidate, _ in pairs])
        plans = [plan for _, plan in pairs]
        rows = _existing_rows(plans)
        seen = _Seen(plans, now)
        pending = _Pending()
        created = 0
        for candidate, plan in pairs:
            if full.every is not None or created >= max_created:
                break
            lost = bool(candidate.inbox_id) and candidate.inbox_id not in owned
            status = rows.items.get(plan.idempotency_key)
            if status is None or status not in KEEP_WORK_ITEM_STATUSES:
                hold, decision, view = _precheck(plan, full, seen)
                if hold is not None:
                    full.saw(plan, *hold, shared_pool=shared_pool)
                    if lost and not candidate.recorded_as(
                        InboxState.DEFERRED, hold[1], hold[0]
                    ):
                        decided.append(None)  # its claim would fail: nothing written
                        continue
                    decided.append(
                        Decided(
                            candidate,
                            held(candidate.envelope, *hold, plan=plan),
                            hold=hold,
                        )
                    )
                    continue
                if lost:  # one at a time claims before it admits: that claim fails
                    decided.append(None)
                    continue
                if (
                    status is None
                    and plan.idempotency_key not in rows.invocations
                    and plan.workflow_name not in rows.specs
                ):
                    check_plan_fits_columns(plan)  # as route_event (an error aborts)
                    routed, load = _admit_fresh(plan, decision, view, now, pending)
                    seen.admitted(plan, load)
                    rows.items[plan.idempotency_key] = WorkItemStatus.ADMITTED
                    rows.invocations.add(plan.idempotency_key)
                    rows.specs.add(plan.workflow_name)
                    decided.append(Decided(candidate, routed.to_dict(), routed=routed))
                    created += 1
                    continue
            elif (
                lost
            ):  # already routed: admission would dedupe, but the claim fails first
                decided.append(None)
                continue
            # Existing rows: the one-at-a-time admission, on the rows written so far.
            check_plan_fits_columns(plan)
            pending.flush()
            routed = _admit(plan, now=now, dry_run=False)
            seen.forget()  # read again after it
            if routed.work_item is not None:
                rows.items[plan.idempotency_key] = routed.work_item.status
            rows.invocations.add(plan.idempotency_key)
            if routed.workflow is not None:
                rows.specs.add(routed.workflow.name)
            if routed.kind == THROTTLED and routed.reason_code:
                full.saw(
                    plan,
                    routed.reason or "",
                    routed.reason_code,
                    shared_pool=shared_pool,
                )
            decided.append(Decided(candidate, routed.to_dict(), routed=routed))
            created += routed.kind == CREATED
        pending.flush()
        _record_inbox([d for d in decided if d is not None], now)
    return decided


def _all_held(
    pairs: Sequence[tuple[Candidate, RoutePlan]],
    *,
    now: datetime,
    full: Any,
    shared_pool: bool,
    held: Any,
) -> list[Decided] | None:
    """The holds of the batch when its pre-check, from unlocked reads, holds every
    candidate (up to a full scope or shared pool); None, with `full` as it was, as soon as
    one would go on to admission.

    Holds are the same as one-at-a-time routing makes (the property test compares them);
    deciding them from an unlocked read is safe, since a hold never raises a count: at
    worst a count that dropped meanwhile holds an item a later drain admits. A drain whose
    caps are full (the common case when several drains compete) then decides without the
    admission lock, without SQLite's write lock, and writes only the holds its rows do not
    record yet."""
    every, keys = full.every, dict(full.keys)
    plans = [plan for _, plan in pairs]
    rows: _Rows | None = (
        None  # read once a hold is found: a batch that admits its first
    )
    seen = _Seen(plans, now)  # candidate pays only the counts (and loads) read here
    decided: list[Decided] = []
    for candidate, plan in pairs:
        if full.every is not None:
            break
        hold = _precheck(plan, full, seen)[0]
        if hold is not None:
            rows = rows or _existing_rows(plans)
            if rows.items.get(plan.idempotency_key) in KEEP_WORK_ITEM_STATUSES:
                hold = None  # one at a time never holds an item that ran: it dedupes
        if hold is None:  # admission (or a dedupe) decides this one: under the lock
            full.every = every
            full.keys.clear()
            full.keys.update(keys)
            return None
        full.saw(plan, *hold, shared_pool=shared_pool)
        decided.append(
            Decided(candidate, held(candidate.envelope, *hold, plan=plan), hold=hold)
        )
    return decided


def _record_holds(holds: list[Decided], now: datetime) -> list[Decided | None]:
    """Claim and record the rows of `holds` that do not record their hold yet (as one at a
    time: one conditional UPDATE each; a row another drain took since the scan is left to
    it and its candidate dropped), in one transaction, in id order (the order a batch
    locks rows in, so the two never deadlock on PostgreSQL)."""
    writes = [
        outcome
        for outcome in holds
        if outcome.candidate.inbox_id
        and outcome.hold is not None
        and not outcome.candidate.recorded_as(
            InboxState.DEFERRED, outcome.hold[1], outcome.hold[0]
        )
    ]
    lost: set[int] = set()
    if writes:
        with transaction.atomic():
            for outcome in sorted(writes, key=lambda o: str(o.candidate.inbox_id)):
                if not _claim(outcome.candidate, **_hold_record(outcome.result, now)):
                    lost.add(id(outcome))
    return [None if id(outcome) in lost else outcome for outcome in holds]


def _own_inbox_rows(candidates: Sequence[Candidate]) -> set[str]:
    """The inbox rows of `candidates` still as the drain scanned them (open, same attempt
    counter), locked until the batch ends: one SELECT, under the admission lock. On
    PostgreSQL `FOR UPDATE` (in id order) makes a concurrent claim wait for this batch and
    then fail; on SQLite the transaction already holds the database's write lock."""
    wanted = [c for c in candidates if c.inbox_id]
    if not wanted:
        return set()
    states = [str(s) for s in OPEN_INBOX_STATES]
    match = " OR ".join(["(id = %s AND route_attempts = %s)"] * len(wanted))
    params: list[object] = [*states]
    for candidate in wanted:
        params += [candidate.inbox_id, candidate.route_attempts]
    lock = (
        " ORDER BY id FOR UPDATE" if connection.features.has_select_for_update else ""
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT id FROM "{InboxEvent._meta.db_table}" '
            f"WHERE state IN ({', '.join(['%s'] * len(states))}) AND ({match}){lock}",
            params,
        )
        return {str(row[0]) for row in cursor.fetchall()}


def _admit_fresh(
    plan: RoutePlan,
    decision: AdmissionDecision | None,
    view: PoolView | None,
    now: datetime,
    pending: _Pending,
) -> tuple[RouteResult, LoadDelta]:
    """Admit a plan that meets no existing row, as `_admit` would, into `pending`."""
    invocation = new_invocation(plan)
    item = _work_item_upsert(
        existing=None,
        plan=plan,
        invocation=invocation,
        status=WorkItemStatus.QUEUED,
        reason=None,
        reason_code=None,
        save=False,
    )
    body = plan.spec
    account_profiles: dict[str, str] | None = None
    assignment = view.assignment if view is not None else None
    if assignment is not None and assignment.profiles:
        body = apply_pool_profiles(plan.spec, assignment.profiles, plan.provider)
        account_profiles = dict(assignment.profiles)
    spec = new_spec(plan, body)
    admitted = work_item_admit_rows(
        item=item,
        spec=spec,
        invocation=invocation,
        loop_name=plan.loop_name,
        loop_description=loop_description(plan, spec),
        reason=admitted_reason(plan),
        now=now,
        max_attempts=plan.max_attempts,
        retry_delay_ms=plan.retry_delay_ms,
    )
    pending.invocations.append(invocation)
    pending.specs.append(spec)
    pending.loops.append(admitted.loop)
    pending.items.append(item)
    pending.runs.append(admitted.run)
    pending.steps.extend(admitted.steps)
    pending.events.append(admitted.event)
    pending.load.add(admitted.load)
    enqueue_run_workflow(admitted.run.id)
    result = RouteResult(
        kind=CREATED,
        idempotency_key=plan.idempotency_key,
        event=plan.envelope,
        work_item=item,
        invocation=invocation,
        workflow=spec,
        loop=admitted.loop,
        run=admitted.run,
        throttle=decision,
        account_profiles=account_profiles,
        route_scope=plan.scope if account_profiles else None,
        task_id=plan.task_id,
        sandbox_preflight=list(plan.sandbox_preflight),
    )
    return result, admitted.load


_ROUTED_FIELDS = [
    "state",
    "work_item",
    "last_reason",
    "reason_code",
    "routed_at",
    "updated_at",
    "route_attempts",
]
_HOLD_FIELDS = [
    "state",
    "last_reason",
    "reason_code",
    "routed_at",
    "updated_at",
    "route_attempts",
]


def _record_inbox(decided: Sequence[Decided], now: datetime) -> None:
    """Record the outcomes on the inbox rows the batch owns (one UPDATE per kind), bumping
    their attempt counters as a claim does. A hold the row already records writes nothing,
    as in one-at-a-time routing."""
    routed: list[InboxEvent] = []
    holds: list[InboxEvent] = []
    for outcome in decided:
        candidate = outcome.candidate
        if not candidate.inbox_id:
            continue
        attempts = candidate.route_attempts + 1
        if outcome.hold is not None:
            reason, code = outcome.hold
            if candidate.recorded_as(InboxState.DEFERRED, code, reason):
                continue
            holds.append(
                InboxEvent(
                    pk=candidate.inbox_id,
                    route_attempts=attempts,
                    **_hold_record(outcome.result, now),
                )
            )
        else:
            result = outcome.routed
            assert result is not None
            routed.append(
                InboxEvent(
                    pk=candidate.inbox_id,
                    state=_INBOX_STATE[result.kind],
                    work_item=result.work_item,
                    last_reason=result.reason
                    or (result.work_item.last_reason if result.work_item else None),
                    reason_code=result.reason_code,
                    routed_at=now,
                    updated_at=now,
                    route_attempts=attempts,
                )
            )
    if routed:
        InboxEvent.objects.bulk_update(routed, _ROUTED_FIELDS)
    if holds:
        InboxEvent.objects.bulk_update(holds, _HOLD_FIELDS)
