"""Benchmarks 1 and 2: admission cost against history size, and against the floor.

One ledger grows backwards in time: 1,000 work items, then 100,000, then 1,000,000 (with
twice as many step runs; tests/bench/seed.py), always with the same small live set. At each
size the same three things are timed, interleaved event by event so that background load on
a shared machine hits all three alike:
  - admission: `route_event` with route, project and group caps and a 12-account pool with
    --max-per-profile: the full transaction under the admission lock, including the
    django-q2 enqueue of the admitted run. Each admitted item is then finished
    (untimed), so the live set and every cap stay where they were and every event is
    admitted (not throttled) — we time the complete path.
  - floor: the same rows (invocation, work item, spec, loop, run, step runs, event) written
    with plain ORM creates in one transaction, no reads and no decisions; and the same again
    with the run's django-q2 task row in that transaction (the floor of an admission that
    enqueues inside its transaction).
  - enqueue: one django-q2 `async_task` (ORM broker), on its own in autocommit.
It also times the counting queries alone, and at the largest size prints their query plans
(EXPLAIN QUERY PLAN / EXPLAIN ANALYZE) and whether every table access goes through an index.

Targets: median admission at 1M ≤ 1.5 × median at 1k; admission ≤ 3 × bare inserts.
"""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.bench import harness

NAME = "admission"
SIZES = [
    harness.scaled(1_000, 10),
    harness.scaled(100_000, 1_000),
    harness.scaled(1_000_000, 10_000),
]
ADMISSIONS = harness.scaled(500, 100)  # per size; p99 of 500 is the 5th slowest
WARMUP = 20
QUERY_REPEATS = harness.scaled(200, 50)
SCOPE = "ci-failures"  # one of the seeded scopes: its count reads real history
CAPS: dict[str, Any] = {
    # Caps above the live set (seed.ACTIVE_ITEMS spread over 50 projects and 12 accounts),
    # so every timed event is admitted and the decision reads every count.
    "max_active": 50,
    "max_active_scope": SCOPE,
    "max_active_per_project": 5,
    "max_active_per_project_group": 20,
    "max_per_profile": 4,
}


def main() -> None:
    db = harness.start(NAME)
    finished = False
    try:
        run(db.vendor)
        finished = True
    finally:
        # Under `make bench` the seeded 1M ledger goes on to the pages benchmark.
        if not (finished and db.hand_over()):
            db.drop()


def run(vendor: str) -> None:
    from django.db import connection

    from tests.bench import seed

    report = harness.Report(
        NAME, "Admission cost vs history size, and vs the floor", vendor
    )
    options = _options()
    events = _events()
    per_size: list[dict[str, Any]] = []
    seeded = 0
    for size in SIZES:
        stats = seed.seed_history(seeded, size - seeded)
        seed.after_bulk_load()
        print(
            f"  seeded {size:,} work items ({stats.work_items:,} new, {stats.step_runs:,} step runs) "
            f"in {stats.seconds:.0f} s",
            flush=True,
        )
        seeded = size
        per_size.append(measure_size(size, options, events))
        print(f"  measured at {size:,}", flush=True)
    counts = _table_counts()
    report.data["table_counts_at_largest"] = counts
    report.data["sizes"] = per_size

    report.table(
        "per admission (ms), by history size",
        ["work items", "step runs", "admission median", "admission p99", "bare inserts median",
         "bare + enqueue in txn", "enqueue alone", "admission/bare",
         "statements admission/bare", "outcomes"],
        [
            [s["size"], s["step_runs"], s["admission_ms"]["median"], s["admission_ms"]["p99"],
             s["bare_ms"]["median"], s["bare_enqueue_ms"]["median"], s["enqueue_ms"]["median"],
             s["ratio_bare"],
             f"{s['queries_per_admission']}/{s['queries_per_bare']}",
             ", ".join(f"{k}={v}" for k, v in s["outcomes"].items())]
            for s in per_size
        ],
    )  # fmt: skip
    report.table(
        "counting queries alone (median ms over repeated calls)",
        ["work items", "admission_rows", "active_counts", "account_state"],
        [
            [
                s["size"],
                s["admission_rows_ms"],
                s["active_counts_ms"],
                s["account_state_ms"],
            ]
            for s in per_size
        ],  # fmt: skip
    )
    first, last = per_size[0], per_size[-1]
    growth = last["admission_ms"]["median"] / first["admission_ms"]["median"]
    report.figure(
        f"admission median at {first['size']:,} items",
        first["admission_ms"]["median"],
        "ms",
    )
    report.figure(
        f"admission median at {last['size']:,} items",
        last["admission_ms"]["median"],
        "ms",
    )
    report.figure(
        f"admission p99 at {last['size']:,} items", last["admission_ms"]["p99"], "ms"
    )
    # The sizes run minutes apart; on a shared machine the load may change in between. The
    # bare inserts, timed alongside, see the same load: this ratio of ratios cancels it.
    report.figure(
        f"load-normalised growth: (admission/bare at {last['size']:,}) / (at {first['size']:,})",
        round(last["ratio_bare"] / first["ratio_bare"], 2),
        "x",
    )
    report.figure(
        f"median at {last['size']:,} / median at {first['size']:,}",
        round(growth, 2),
        "x",
        "<= 1.5x",
        growth <= 1.5,
    )
    for s in per_size:
        report.figure(
            f"admission / bare inserts at {s['size']:,}",
            s["ratio_bare"],
            "x",
            "<= 3x",
            s["ratio_bare"] <= 3,
        )
    report.figure(
        f"admission / (bare inserts + enqueue in the same transaction) at {last['size']:,}",
        last["ratio_bare_enqueue"],
        "x",
    )
    reads = (
        last["admission_rows_ms"] + last["active_counts_ms"] + last["account_state_ms"]
    )
    report.figure(
        f"decision reads alone (rows to reuse + counts + account state) / bare inserts "
        f"at {last['size']:,}",
        round(reads / last["bare_ms"]["median"], 2),
        "x",
    )
    report.figure(
        f"enqueue alone (autocommit) / bare inserts at {last['size']:,}",
        round(last["enqueue_ms"]["median"] / last["bare_ms"]["median"], 2),
        "x",
    )

    plans = explain_counting_queries(options, events)
    report.data["plans"] = plans
    all_indexed = all(p["indexed"] for p in plans)
    for n, p in enumerate(plans, 1):
        print(
            f"\n  plan {n}: {p['label']} [{'index' if p['indexed'] else 'NOT INDEXED'}]"
        )
        print(f"    {p['sql']}")
        for line in p["plan"]:
            print(f"      {line}")
    report.figure(
        f"counting queries using an index at {last['size']:,}",
        f"{sum(p['indexed'] for p in plans)}/{len(plans)}",
        "",
        "all",
        all_indexed,
    )
    report.note(
        "admission = route_event end to end (plan, early dedupe, the locked transaction and "
        "the run's django-q2 enqueue); bare = the same 7 rows via ORM create() in one "
        "transaction; bare + enqueue in txn = those rows and the task row in one transaction; "
        "enqueue alone = async_task in autocommit"
    )
    report.note(
        f"history at the largest size: {', '.join(f'{k}={v:,}' for k, v in counts.items())}"
    )
    if connection.vendor == "sqlite":
        report.note(
            "SQLite: no ANALYZE was run (Django never runs it), so these are default plans"
        )
    report.finish()


# --- the three timed operations ---------------------------------------------------------------


def _options() -> Any:
    from routing.admission import route_options
    from tests.bench.seed import ACCOUNTS

    return route_options({**CAPS, "auth_profile_pool": ",".join(ACCOUNTS)})


class _Events:
    """Generic events spread over the 50 busiest seeded projects (real history behind each)."""

    def __init__(self) -> None:
        self.serial = itertools.count()

    def next(self) -> dict[str, Any]:
        from tests.bench.seed import PROJECTS, project_group

        n = next(self.serial)
        k = (n * 7) % 50
        data: dict[str, Any] = {
            "project_path": PROJECTS[k],
            "message": f"build {n} failed on main: 2 tests failing",
            "title": f"CI failure {n}",
        }
        if group := project_group(k):
            data["project_group"] = group
        # Unique in the first 8 characters: generic workflow names keep only those (upstream).
        return {"id": f"b{n:07d}", "type": "build.failed", "source": "ci", "data": data}


def _events() -> _Events:
    return _Events()


def _admit(options: Any, event: dict[str, Any]) -> Any:
    from routing.admission import route_event

    return route_event(kind="generic", envelope=event, options=options, env={})


def _finish(result: Any) -> None:
    """The item completes (as the runner would finalize it): its cap slot and account free."""
    from django.db import transaction

    from ledger.models import WorkflowRun, WorkflowStepRun, WorkflowWorkItem
    from ledger.services.account_loads import apply_load_delta, load_change, run_load

    item = result.work_item
    if item is None or result.kind != "created":
        return
    with transaction.atomic():
        # The run ends: release the load it kept on its accounts
        # (ledger.services.account_loads).
        steps = list(
            WorkflowStepRun.objects.filter(workflow_run_id=item.workflow_run_id)
        )
        apply_load_delta(load_change(run_load("queued", steps), run_load(None, [])))
        WorkflowStepRun.objects.filter(workflow_run_id=item.workflow_run_id).update(
            status="succeeded"
        )
        WorkflowRun.objects.filter(pk=item.workflow_run_id).update(status="succeeded")
        WorkflowWorkItem.objects.filter(pk=item.pk).update(status="succeeded")


def _bare_rows(
    options: Any, event: dict[str, Any], *, enqueue: bool = False
) -> Callable[[], None]:
    """The admission's rows, precomputed (untimed); the returned call only inserts them.

    With `enqueue`, the run's django-q2 task row goes into the same transaction too: the
    floor for an admission that enqueues inside its own transaction.
    """
    import os
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from domain.events import parse_envelope
    from domain.templates import step_account
    from ledger.ids import new_id
    from ledger.models import (
        Loop,
        WorkflowEvent,
        WorkflowInvocation,
        WorkflowRun,
        WorkflowSpec,
        WorkflowStepRun,
        WorkflowWorkItem,
    )
    from routing.admission import plan_reads, plan_route

    plan = plan_route(
        kind="generic",
        envelope=parse_envelope(event),
        options=options,
        env={},
        cwd=os.getcwd(),
        reads=plan_reads(),
    )
    assert not hasattr(plan, "kind"), "the floor event must be routable"
    steps = plan.spec["steps"]

    def insert() -> None:
        now = timezone.now()
        item_id, run_id = new_id(), new_id()
        # Terminal statuses: same row sizes, but the floor's rows never occupy a cap slot.
        with transaction.atomic():
            invocation = WorkflowInvocation.objects.create(
                source_kind="event",
                source_dedupe_key=plan.idempotency_key,
                **plan.invocation_fields,
            )
            spec = WorkflowSpec.objects.create(
                name=plan.workflow_name,
                description=f"{plan.template_id} for event {plan.envelope.id}",
                version=1,
                goal_json=None,
                steps_json=steps,
            )
            loop = Loop.objects.create(
                name=plan.loop_name,
                description=f"Run {spec.name} once; idempotency={plan.idempotency_key}",
                schedule_json={
                    "type": "once",
                    "at": (now + timedelta(seconds=1)).isoformat(),
                },
                target_json={
                    "type": "workflow",
                    "workflowId": spec.id,
                    "input": {
                        "workflowInvocationId": invocation.id,
                        "workflowWorkItemId": item_id,
                    },
                },
                overlap="skip",
                max_attempts=1,
                lease_ms=5_400_000,
            )
            run = WorkflowRun.objects.create(
                id=run_id,
                workflow=spec,
                workflow_name=spec.name,
                loop=loop,
                invocation=invocation,
                work_item_id=item_id,
                idempotency_key=f"{item_id}:1",
                status="succeeded",
            )
            WorkflowStepRun.objects.bulk_create(
                [
                    WorkflowStepRun(
                        workflow_run=run,
                        step_id=step["id"],
                        sequence=index,
                        status="succeeded",
                        account_profile=step_account(step)[0],
                        account_tool=step_account(step)[1],
                    )
                    for index, step in enumerate(steps)
                ]
            )
            WorkflowEvent.objects.create(
                workflow_run=run,
                sequence=1,
                event_type="created",
                payload_json={"workItemId": item_id},
            )
            WorkflowWorkItem.objects.create(
                id=item_id,
                route_key=plan.route_key,
                idempotency_key=plan.idempotency_key,
                invocation=invocation,
                source_type=plan.envelope.type,
                source_ref=plan.envelope.id,
                subject_ref=plan.subject_ref,
                project_key=plan.project_path,
                project_group=plan.project_group,
                route_scope=plan.scope,
                status="succeeded",
                attempts=1,
                workflow=spec,
                loop=loop,
                workflow_run=run,
                last_reason=f"admitted by {plan.route_key} route",
            )
            if enqueue:
                _enqueue(run_id)

    return insert


def _enqueue(run_id: str) -> None:
    from django_q.tasks import async_task

    async_task("runs.tasks.run_workflow", run_id, task_name=f"bench-enqueue-{run_id}")


def measure_size(size: int, options: Any, events: _Events) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from ledger.selectors import account_state, active_counts, admission_rows
    from tests.bench.seed import PROJECTS, project_group

    for _ in range(WARMUP):
        _finish(_admit(options, events.next()))
        _bare_rows(options, events.next())()
    with CaptureQueriesContext(connection) as ctx:
        probe = _admit(options, events.next())
    queries = len(ctx.captured_queries)
    _finish(probe)
    insert = _bare_rows(options, events.next())
    with CaptureQueriesContext(connection) as ctx:
        insert()
    bare_queries = len(ctx.captured_queries)

    # Each timed region ends with ensure_connection(): django-q2's ORM broker calls
    # close_old_connections() when it enqueues outside a transaction, which (CONN_MAX_AGE 0)
    # closes the connection. The reconnect belongs to the operation that caused it, not to
    # whatever runs next.
    admission, bare, bare_enqueue, enqueue = [], [], [], []
    outcomes: Counter[str] = Counter()
    for _ in range(ADMISSIONS):
        event = events.next()
        connection.ensure_connection()
        start = time.perf_counter()
        result = _admit(options, event)
        connection.ensure_connection()
        admission.append((time.perf_counter() - start) * 1000)
        outcomes[result.kind] += 1
        _finish(result)

        insert = _bare_rows(options, events.next())
        connection.ensure_connection()
        start = time.perf_counter()
        insert()
        connection.ensure_connection()
        bare.append((time.perf_counter() - start) * 1000)

        insert = _bare_rows(options, events.next(), enqueue=True)
        connection.ensure_connection()
        start = time.perf_counter()
        insert()
        connection.ensure_connection()
        bare_enqueue.append((time.perf_counter() - start) * 1000)

    # On its own (autocommit), as any caller outside a transaction pays it. In a loop of its
    # own: its close-and-reconnect would hand the next admission a new session with cold
    # caches (on PostgreSQL a new backend process), which the bare inserts never pay.
    for n in range(ADMISSIONS):
        start = time.perf_counter()
        _enqueue(f"bench-{size}-{n}")
        connection.ensure_connection()
        enqueue.append((time.perf_counter() - start) * 1000)

    group = project_group(0)
    reads: dict[str, list[float]] = {"rows": [], "counts": [], "state": []}
    for n in range(QUERY_REPEATS):
        start = time.perf_counter()
        admission_rows(
            route_key="generic-event",
            idempotency_key=f"generic-event:ci:probe-{n}",
            workflow_name=f"generic-probe-{n}",
        )
        reads["rows"].append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        active_counts(scope=SCOPE, project_key=PROJECTS[0], project_group=group)
        reads["counts"].append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        account_state(now=timezone.now())
        reads["state"].append((time.perf_counter() - start) * 1000)

    def summary(values: list[float]) -> dict[str, float]:
        return {
            "median": round(harness.median(values), 3),
            "p99": round(harness.percentile(values, 99), 3),
            "mean": round(sum(values) / len(values), 3),
        }

    a, b, e = summary(admission), summary(bare), summary(enqueue)
    be = summary(bare_enqueue)
    return {
        "size": size,
        "step_runs": _count("workflow_step_runs"),
        "admission_ms": a,
        "bare_ms": b,
        "enqueue_ms": e,
        "bare_enqueue_ms": be,
        "ratio_bare": round(a["median"] / b["median"], 2),
        "ratio_bare_enqueue": round(a["median"] / be["median"], 2),
        "queries_per_admission": queries,
        "queries_per_bare": bare_queries,
        "outcomes": dict(outcomes),
        "admission_rows_ms": round(harness.median(reads["rows"]), 3),
        "active_counts_ms": round(harness.median(reads["counts"]), 3),
        "account_state_ms": round(harness.median(reads["state"]), 3),
    }


def _count(table: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f'SELECT COUNT(*) FROM "{table}"')
        return int(cursor.fetchone()[0])


def _table_counts() -> dict[str, int]:
    return {
        t: _count(t)
        for t in (
            "workflow_work_items",
            "workflow_step_runs",
            "workflow_runs",
            "workflow_invocations",
            "workflow_work_item_deferrals",
        )
    }


# --- query plans ------------------------------------------------------------------------------

# Tables that hold one row per account (the pool's size, whatever the ledger holds): reading
# one whole is the O(accounts) read issue 18 asks for, and PostgreSQL rightly scans them.
PER_ACCOUNT_TABLES = ("account_cooldowns", "workflow_account_loads")
# Tables that grow with history: a sequential scan of one would grow with the ledger.
LEDGER_TABLES = (
    "workflow_work_items",
    "workflow_step_runs",
    "workflow_runs",
    "workflow_invocations",
    "workflow_specs",
)


def explain_counting_queries(options: Any, events: _Events) -> list[dict[str, Any]]:
    """EXPLAIN each read an admission sends (selectors.py), as it sends it."""
    from django.db import connection
    from django.utils import timezone

    from ledger.selectors import account_state, active_counts, admission_rows
    from tests.bench.seed import PROJECTS, project_group

    captured: list[tuple[str, str, Any]] = []
    label = ""

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        captured.append((label, sql, params))
        return execute(sql, params, many, context)

    probe = events.next()["id"]
    with connection.execute_wrapper(capture):
        label = "admission_rows"
        admission_rows(
            route_key="generic-event",
            idempotency_key=f"generic-event:ci:{probe}",
            workflow_name=f"generic-{probe}",
        )
        label = "active_counts"
        active_counts(
            scope=SCOPE, project_key=PROJECTS[0], project_group=project_group(0)
        )
        label = "account_state"
        account_state(now=timezone.now())
    # Names for the statements as selectors.py sends them today; if their number changes,
    # fall back to "query k of n".
    names = {"admission_rows": ["item, invocation and active spec to reuse"],
             "active_counts": ["scope, project and group counts"],
             "account_state": ["running + reserved steps per account, cooldowns"]}  # fmt: skip
    totals = Counter(source for source, _, _ in captured)
    seen: Counter[str] = Counter()
    plans = []
    for source, sql, params in captured:
        index = seen[source]
        seen[source] += 1
        name = (
            names[source][index]
            if totals[source] == len(names[source])
            else f"query {index + 1} of {totals[source]}"
        )
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
                lines = [row[-1] for row in cursor.fetchall()]
            else:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + sql, params)
                lines = [row[0] for row in cursor.fetchall()]
        plans.append(
            {
                "label": f"{source}: {name}",
                "sql": _inline(sql, params),
                "plan": lines,
                "indexed": _uses_indexes(connection.vendor, lines),
            }
        )
    return plans


def _inline(sql: str, params: Any) -> str:
    text = re.sub(r"\s+", " ", sql).strip()  # raw SQL from selectors.py spans lines
    for value in params or ():
        shown = (
            repr(str(value)) if isinstance(value, str) else repr(value)
        )  # TextChoices
        text = text.replace("%s", shown, 1)
    return text


def _uses_indexes(vendor: str, lines: list[str]) -> bool:
    """True when every table access is an index look-up, never a full scan.

    SQLite: `SEARCH x USING [COVERING] INDEX …` (or the primary key) is a look-up; `SCAN x`
    reads the whole table or index (even `USING COVERING INDEX`), unless x is a subquery or
    co-routine of the same plan (`SCAN (subquery-1)`, `CO-ROUTINE firsts` … `SCAN firsts`),
    which only reads rows an earlier step produced, or the kept account loads (one row per
    account, whatever the ledger holds). An AUTOMATIC index is one SQLite builds
    for this statement because no index fits: not index use either. Aliases (`SEARCH s`) are
    why the table name is not what is matched.
    PostgreSQL: no `Seq Scan` on a ledger table, and at least one index scan, unless every
    table read is a per-account one (PER_ACCOUNT_TABLES).
    """
    if vendor == "sqlite":
        derived = {"CONSTANT ROW", *PER_ACCOUNT_TABLES}
        for line in lines:
            for prefix in ("CO-ROUTINE ", "MATERIALIZE "):
                if line.startswith(prefix):
                    derived.add(line[len(prefix) :].strip())
        searched = False
        for line in lines:
            if line.startswith("SCAN "):
                name = line[len("SCAN ") :].split(" USING")[0].strip()
                if name not in derived and not name.startswith("("):
                    return False
            elif line.startswith("SEARCH "):
                if "AUTOMATIC" in line or not (
                    "INDEX" in line or "PRIMARY KEY" in line
                ):
                    return False
                searched = True
        return searched
    text = "\n".join(lines)
    if any(f"Seq Scan on {t}" in text for t in LEDGER_TABLES):
        return False
    scanned = set(re.findall(r"Seq Scan on (\w+)", text))
    return "Index" in text or bool(scanned) and scanned <= set(PER_ACCOUNT_TABLES)


if __name__ == "__main__":
    main()
