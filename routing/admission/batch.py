"""Stage 2 of admission for many plans: one transaction, one lock hold, with the decisions
of one at a time (`transaction.admit`): plans are taken in order and each sees the counts as
the ones before it left them. The decision is the same code (`decide.precheck`), the rows the same
builders (`rows`); what changes is how often the database is asked:
  - the rows an admission may reuse, the cap counts and the account loads are read once per
    batch; counts and loads are then updated in memory as plans are admitted (safe: every
    writer that raises a count holds the same lock; writers that lower one without it, a
    finishing step, only make the kept view conservative for this batch);
  - the new rows (invocations, specs, loops, items, runs, step runs, events) are written with
    one bulk INSERT per table, the account loads with one upsert.
A plan that meets existing rows (an item seen before, a reused invocation or spec) is
admitted by `transaction.admit`, in the same transaction, after the rows decided before it
are written; the counts are read again after it.

The caller (a drain, `routing.drains.inbox_batch`) opens the transaction and takes the admission
lock; `admit_batch` never sees inbox rows: `claimable` tells it which plans it may decide.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from django.db.models import Model

from domain.keys import TODOS_TASK
from domain.throttle import AdmissionDecision, ThrottleCounts
from ledger.models import (
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
from ledger.selectors import (
    ActiveCountsByKey,
    account_registry,
    account_state,
    active_counts_by_key,
)
from ledger.services import work_item_admit_rows
from ledger.services.account_loads import LoadDelta, apply_load_delta
from ledger.windows import state_windows
from routing.admission.decide import (
    FullCaps,
    Hold,
    PoolView,
    Precheck,
    pool_view,
    precheck,
)
from routing.admission.plan import RoutePlan
from routing.admission.results import CREATED, THROTTLED, RouteResult
from routing.admission.rows import (
    admitted_reason,
    created_result,
    loop_description,
    new_invocation,
    new_spec,
    pool_body,
    work_item_upsert,
)
from routing.admission.transaction import RouteRefused, admit, refusal_of

Outcome = Hold | RouteResult | RouteRefused | None
"""What a batch decided for one plan: a hold (nothing written), an admission's result, the
refusal of a plan admission did not dedupe (nothing written), or None for a plan it was not
allowed to decide (`claimable` said no)."""


@dataclass
class ExistingRows:
    """Existing rows the batch's plans would meet: item status by idempotency key, event
    invocations by dedupe key, active spec names."""

    items: dict[str, str] = field(default_factory=dict)
    invocations: set[str] = field(default_factory=set)
    specs: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, plans: Sequence[RoutePlan]) -> ExistingRows:
        rows = cls()
        by_route: dict[str, list[str]] = defaultdict(list)
        for plan in plans:
            by_route[plan.route_key].append(plan.idempotency_key)
        for route_key, keys in by_route.items():
            rows.items.update(
                WorkflowWorkItem.objects.filter(
                    route_key=route_key, idempotency_key__in=keys
                ).values_list("idempotency_key", "status")
            )
        rows.invocations = {
            key  # never None (matched by IN), but the column is nullable
            for key in WorkflowInvocation.objects.filter(
                source_kind="event",
                source_dedupe_key__in=[p.idempotency_key for p in plans],
            ).values_list("source_dedupe_key", flat=True)
            if key is not None
        }
        rows.specs = set(
            WorkflowSpec.objects.filter(
                status=SpecStatus.ACTIVE, name__in=[p.workflow_name for p in plans]
            ).values_list("name", flat=True)
        )
        return rows

    def meets(self, plan: RoutePlan) -> bool:
        """Whether admitting `plan` would reuse or update a row."""
        return (
            plan.idempotency_key in self.items
            or plan.idempotency_key in self.invocations
            or plan.workflow_name in self.specs
        )

    def routed(self, plan: RoutePlan) -> bool:
        """Whether the plan's item ran or runs (admission dedupes it, never holds it)."""
        return self.items.get(plan.idempotency_key) in KEEP_WORK_ITEM_STATUSES

    def saw(self, plan: RoutePlan, result: RouteResult) -> None:
        if result.work_item is not None:
            self.items[plan.idempotency_key] = result.work_item.status
        self.invocations.add(plan.idempotency_key)
        if result.workflow is not None:
            self.specs.add(result.workflow.name)


class _Counts:
    """Active items per scope, project and group, read once for a batch's plans and kept up
    to date in memory."""

    def __init__(self, plans: Sequence[RoutePlan]) -> None:
        self.seen: ActiveCountsByKey = active_counts_by_key(
            scopes=[p.scope for p in plans],
            projects=[p.project_path for p in plans],
            groups=[p.project_group for p in plans],
        )

    def of(self, plan: RoutePlan) -> ThrottleCounts:
        seen = self.seen
        return ThrottleCounts(
            scope=seen.scope.get(plan.scope or "", 0),
            project=seen.project.get(plan.project_path, 0) if plan.project_path else 0,
            project_group=seen.group.get(plan.project_group, 0)
            if plan.project_group
            else None,
        )

    def admitted(self, plan: RoutePlan) -> None:
        seen, scope = self.seen, plan.scope or ""
        seen.scope[scope] = seen.scope.get(scope, 0) + 1
        if plan.project_path:
            seen.project[plan.project_path] = seen.project.get(plan.project_path, 0) + 1
        if plan.project_group:
            seen.group[plan.project_group] = seen.group.get(plan.project_group, 0) + 1


class _Loads:
    """Account loads and cooldowns (as `ledger.selectors.account_state`), kept in memory."""

    def __init__(self, now: datetime) -> None:
        state = account_state(now=now, windows=True)
        self.total: dict[str, int] = state.load.total()
        self.cooling = state.cooling
        self.registry = account_registry()  # the registry is small: read it whole, once
        self.now = now
        self.windows = state_windows(  # every account's windows, in the same read
            state, {n: r.window_budgets for n, r in self.registry.items()}, now
        )

    def view(self, plan: RoutePlan) -> PoolView:
        # As `decide.pool_assignment_now`, from the loads in memory.
        return pool_view(
            plan,
            loads=dict(self.total),
            cooling=self.cooling,
            registry=self.registry,
            windows=self.windows,
            now=self.now,
        )

    def add(self, delta: LoadDelta) -> None:
        for counter in (delta.running, delta.reserved):
            for account, n in counter.items():
                self.total[account] = self.total.get(account, 0) + n


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

    def precheck(self, plan: RoutePlan, caps: FullCaps) -> Precheck:
        return precheck(
            plan,
            counts=lambda: self.counts().of(plan),
            view=lambda: self.loads().view(plan),
            caps=caps,
        )

    def admitted(self, plan: RoutePlan, load: LoadDelta) -> None:
        if self._counts is not None:
            self._counts.admitted(plan)
        if self._loads is not None:
            self._loads.add(load)

    def forget(self) -> None:
        self._counts = self._loads = None


M = TypeVar("M", bound=Model)


def _insert(model: type[M], rows: list[M]) -> None:
    """The buffered rows of `model` in one bulk_create, then an empty buffer."""
    if rows:
        model._default_manager.bulk_create(rows)  # `objects`: none has another manager
        rows.clear()


@dataclass
class PendingRows:
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
        # parents before children: the foreign keys point up this list
        _insert(WorkflowInvocation, self.invocations)
        _insert(WorkflowSpec, self.specs)
        _insert(Loop, self.loops)
        _insert(WorkflowWorkItem, self.items)
        _insert(WorkflowRun, self.runs)
        _insert(WorkflowStepRun, self.steps)
        _insert(WorkflowEvent, self.events)
        apply_load_delta(self.load)
        self.load = LoadDelta()

    def admit(
        self,
        plan: RoutePlan,
        decision: AdmissionDecision | None,
        view: PoolView | None,
        now: datetime,
    ) -> tuple[RouteResult, LoadDelta]:
        """Admit a plan that meets no existing row, as `admit` would, into the pending rows;
        its run is handed to the runner when the transaction commits."""
        invocation = new_invocation(plan)
        item = work_item_upsert(
            existing=None,
            plan=plan,
            invocation=invocation,
            status=WorkItemStatus.QUEUED,
            reason=None,
            reason_code=None,
            save=False,
        )
        body, account_profiles = pool_body(plan, view.assignment if view else None)
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
        self.invocations.append(invocation)
        self.specs.append(spec)
        self.loops.append(admitted.loop)
        self.items.append(item)
        self.runs.append(admitted.run)
        self.steps.extend(admitted.steps)
        self.events.append(admitted.event)
        self.load.add(admitted.load)
        # The run is inserted with the batch: its steps tell the queue where it can run.
        enqueue_run_workflow(admitted.run.id, steps=spec.steps_json)
        result = created_result(
            plan,
            item=item,
            invocation=invocation,
            spec=spec,
            loop=admitted.loop,
            run=admitted.run,
            decision=decision,
            account_profiles=account_profiles,
        )
        return result, admitted.load


@dataclass
class _Batch:
    """One batch's state while `admit_batch` decides its plans in order, in three stages:
    a refused plan (`refused`), an item with no rows yet (`new_item`, decided from the
    batch's reads) and an item with rows (`on_existing_rows`, one-at-a-time admission)."""

    now: datetime
    caps: FullCaps
    shared_pool: bool
    claimable: Callable[[int, Hold | None], bool]
    rows: ExistingRows
    seen: _Seen
    pending: PendingRows = field(default_factory=PendingRows)
    created: int = 0

    def decide(self, index: int, plan: RoutePlan) -> Outcome:
        if plan.refusal is not None:
            return self.refused(index, plan)
        if not self.rows.routed(plan):
            decided, outcome = self.new_item(index, plan)
            if decided:
                return outcome
        elif not self.claimable(index, None):
            return None
        return self.on_existing_rows(plan)

    def refused(self, index: int, plan: RoutePlan) -> Outcome:
        """Refused unless the item ran or runs (the batch's lookup says): then the
        one-at-a-time admission dedupes (or re-admits, and so refuses) it, writing nothing
        either way. The refusal is this plan's outcome; the batch goes on."""
        if not self.claimable(index, None):
            return None
        if not self.rows.routed(plan):
            return refusal_of(plan)
        self.pending.flush()
        try:
            deduped = admit(
                plan, now=self.now, early_dedupe=plan.route_key == TODOS_TASK
            )
        except RouteRefused as refused:
            return refused
        assert isinstance(deduped, RouteResult)
        self.rows.saw(plan, deduped)
        return deduped

    def new_item(self, index: int, plan: RoutePlan) -> tuple[bool, Outcome]:
        """A plan whose item has no rows: held, or admitted with the batch's pending rows.
        (False, None) when its rows turn out to exist (`meets`): one-at-a-time admission."""
        checked = self.seen.precheck(plan, self.caps)
        if checked.hold is not None:
            self.caps.saw(plan, checked.hold, shared_pool=self.shared_pool)
            ok = self.claimable(index, checked.hold)
            return True, (checked.hold if ok else None)
        if not self.claimable(index, None):
            return True, None
        if self.rows.meets(plan):
            return False, None
        result, load = self.pending.admit(
            plan, checked.decision, checked.view, self.now
        )
        self.seen.admitted(plan, load)
        self.rows.saw(plan, result)
        self.created += 1
        return True, result

    def on_existing_rows(self, plan: RoutePlan) -> Outcome:
        """The one-at-a-time admission, on the rows written so far."""
        self.pending.flush()
        routed = admit(plan, now=self.now)
        assert isinstance(routed, RouteResult)  # no holds without hold_when_full
        self.seen.forget()  # read again after it
        self.rows.saw(plan, routed)
        if routed.kind == THROTTLED and routed.reason_code:
            self.caps.saw(
                plan,
                Hold(routed.reason or "", routed.reason_code),
                shared_pool=self.shared_pool,
            )
        self.created += routed.kind == CREATED
        return routed


def admit_batch(
    plans: Sequence[RoutePlan],
    *,
    now: datetime,
    caps: FullCaps,
    shared_pool: bool,
    max_created: int,
    claimable: Callable[[int, Hold | None], bool],
) -> list[Outcome]:
    """Decide and write `plans` in order; call inside a transaction, after `admission_lock()`.

    `caps` is updated as one-at-a-time routing would. `claimable(i, hold)` says whether plan
    `i` may be decided with that outcome (hold None: an admission or a dedupe); a plan it
    refuses gets None and no write. Returns the outcomes of the plans it decided: all of
    them, or those up to the one that made the `max_created`th admission, or those before the
    one that found the scope (or a shared pool) full. An error propagates; the caller's
    transaction then rolls the whole batch back.
    """
    batch = _Batch(
        now=now,
        caps=caps,
        shared_pool=shared_pool,
        claimable=claimable,
        rows=ExistingRows.read(plans),
        seen=_Seen(plans, now),
    )
    outcomes: list[Outcome] = []
    for index, plan in enumerate(plans):
        if caps.every is not None or batch.created >= max_created:
            break
        outcomes.append(batch.decide(index, plan))
    batch.pending.flush()
    return outcomes


def holds_without_lock(
    plans: Sequence[RoutePlan], *, now: datetime, caps: FullCaps, shared_pool: bool
) -> list[Hold] | None:
    """The holds of `plans` when the pre-check, from unlocked reads, holds every one of them
    (up to a full scope or shared pool); None, with `caps` as it was, as soon as one would go
    on to admission.

    Holds are the same as one-at-a-time routing makes (the property test compares them);
    deciding them from an unlocked read is safe, since a hold never raises a count: at
    worst a count that dropped meanwhile holds an item a later drain admits. A drain whose
    caps are full (the common case when several drains compete) then decides without the
    admission lock, without SQLite's write lock, and writes only the holds its rows do not
    record yet."""
    before = FullCaps()
    before.copy_from(caps)
    rows: ExistingRows | None = (
        None  # read once a hold is found: a batch that admits its
    )
    seen = _Seen(plans, now)  # first plan pays only the counts (and loads) read here
    holds: list[Hold] = []
    for plan in plans:
        if caps.every is not None:
            break
        hold = seen.precheck(plan, caps).hold
        if hold is not None:
            rows = rows or ExistingRows.read(plans)
            if rows.routed(plan):
                hold = None  # one at a time never holds an item that ran: it dedupes
        if hold is None:  # admission (or a dedupe) decides this one: under the lock
            caps.copy_from(before)
            return None
        caps.saw(plan, hold, shared_pool=shared_pool)
        holds.append(hold)
    return holds
