"""Benchmark: drains at the speed of the database (issue 18), with admitted runs piling up.

Todos-task events over 20 projects, a pool of 5 accounts, caps set but too high to bind, no
runner: every admitted run stays queued, as when agents are slower than drains. One drain
admits them all (max_dispatch = limit = the number of events). Each phase runs in its own
process on its own throwaway database:
  - batched: the drain as configured (LOOPSWEB_DRAIN_BATCH_SIZE, 50);
  - one at a time: the same drain with batches of 1 (one pass per event);
  - per-event floor: the same rows (invocation, spec, loop, item, run, step runs, event, task
    row, account load, inbox update) written one transaction per event, precomputed, ORM;
  - bulk floor: the same rows with one bulk INSERT per table per 50 events;
  - backlog: the batched drain of BACKLOG_EVENTS more events with QUEUED runs already queued;
  - runner: statements the runner sends for one 2-step run (worker, verifier) on the fake
    agent, claim to finalize.
Figures: events/s; the cost per event of the last 200 over the first 200 (flat: ≤ 1.2×);
ratios to both floors (batched: within 2× of the bulk floor); statements per admitted event
(≤ 14), counted with a connection execute wrapper.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from tests.bench import harness

NAME = "backlog"
EVENTS = harness.scaled(2_000, 200)
QUEUED = harness.scaled(5_000, 100)
BACKLOG_EVENTS = harness.scaled(10_000, 200)
WINDOW = harness.scaled(200, 50)  # events in the first and last windows (>= one batch)
PROJECTS = [f"/srv/backlog/p{n:02d}" for n in range(20)]
ACCOUNTS = ("acct-a", "acct-b", "acct-c", "acct-d", "acct-e")
CAPS: dict[str, Any] = {
    "max_active": 100_000,
    "max_active_per_project": 100_000,
    "auth_profile_pool": ",".join(ACCOUNTS),
    "max_per_profile": 100_000,
}
CHUNK = 50
PHASES = (
    "batched",
    "one_at_a_time",
    "floor_per_event",
    "floor_bulk",
    "backlog",
    "runner",
)
# Runner statements per 2-step run before issue 18 (measured at 27bbb9a).
RUNNER_BEFORE = {"sqlite": 66, "postgresql": 70}


def _event(n: int, prefix: str = "t") -> dict[str, Any]:
    task = f"{prefix}-{n}"
    return {
        "id": f"evt-{task}",
        "type": "task.created",
        "source": "@hasna/todos",
        "data": {
            "id": task,
            "title": f"Fix {task}",
            "tags": ["auto:route"],
            "project_path": PROJECTS[n % len(PROJECTS)],
        },
    }


def _ingest(count: int, prefix: str) -> None:
    from routing.drains.inbox import inbox_ingest

    inbox_ingest((n, _event(n, prefix)) for n in range(count))


class _Statements:
    """Counts statements sent on the default connection (DEBUG stays off)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(
        self, execute: Any, sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        self.n += 1
        return execute(sql, params, many, context)


def _drain(count: int) -> dict[str, Any]:
    """One drain of everything pending, timed per result; returns the figures."""
    from django.db import connection

    from routing.drains import drain_options, drain_run

    options = drain_options(
        "todos-task", {**CAPS, "max_dispatch": count, "limit": count}
    )
    stamps: list[float] = []
    counter = _Statements()
    started = time.perf_counter()
    with connection.execute_wrapper(counter):
        report = drain_run(
            options=options,
            env={},
            progress=lambda r: stamps.append(time.perf_counter()),
        )
    seconds = time.perf_counter() - started
    created = report.counts["created"]
    assert created == count, f"admitted {created} of {count}: {report.counts}"
    first = stamps[WINDOW - 1] - started
    last = stamps[-1] - stamps[-WINDOW - 1]
    return {
        "events": count,
        "seconds": round(seconds, 3),
        "events_per_s": round(count / seconds, 1),
        "first_ms_per_event": round(1000 * first / WINDOW, 3),
        "last_ms_per_event": round(1000 * last / WINDOW, 3),
        "last_over_first": round(last / first, 2),
        "statements": counter.n,
        "statements_per_admitted": round(counter.n / created, 2),
    }


def _floor_rows(count: int) -> list[dict[str, Any]]:
    """Precomputed rows of `count` admissions (untimed), as the drain would write them."""
    import os

    from django.utils import timezone

    from domain.events import parse_envelope
    from domain.templates import apply_pool_profiles
    from ledger.services import work_item_admit_rows
    from routing.admission import plan_reads, plan_route, route_options
    from routing.admission.rows import (
        admitted_reason,
        loop_description,
        new_invocation,
        new_spec,
        work_item_upsert,
    )
    from routing.models import InboxEvent

    options = route_options(CAPS)
    inbox = dict(InboxEvent.objects.values_list("event_id", "id"))
    now = timezone.now()
    out = []
    for n in range(count):
        event = _event(n, "floor")
        plan = plan_route(
            kind="todos-task",
            envelope=parse_envelope(event),
            options=options,
            env={},
            cwd=os.getcwd(),
            reads=plan_reads(),
        )
        invocation = new_invocation(plan)
        item = work_item_upsert(
            existing=None,
            plan=plan,
            invocation=invocation,
            status="queued",
            reason=None,
            reason_code=None,
            save=False,
        )
        profiles = {role: ACCOUNTS[(n + i) % 5] for i, role in enumerate(plan.roles)}
        spec = new_spec(plan, apply_pool_profiles(plan.spec, profiles))
        rows = work_item_admit_rows(
            item=item,
            spec=spec,
            invocation=invocation,
            loop_name=plan.loop_name,
            loop_description=loop_description(plan, spec),
            reason=admitted_reason(plan),
            now=now,
        )
        out.append(
            {
                "invocation": invocation,
                "spec": spec,
                "item": item,
                "rows": rows,
                "inbox": inbox[event["id"]],
            }
        )
    return out


def _floor(count: int, bulk: bool) -> dict[str, Any]:
    from django.db import connection, transaction
    from django.utils import timezone

    from ledger.models import (
        Loop,
        WorkflowEvent,
        WorkflowInvocation,
        WorkflowRun,
        WorkflowSpec,
        WorkflowStepRun,
        WorkflowWorkItem,
    )
    from ledger.queue import enqueue_run_workflow
    from ledger.services.account_loads import LoadDelta, apply_load_delta
    from routing.models import InboxEvent

    admissions = _floor_rows(count)
    counter = _Statements()
    started = time.perf_counter()
    with connection.execute_wrapper(counter):
        if not bulk:
            for a in admissions:
                with transaction.atomic():
                    rows = a["rows"]
                    a["invocation"].save(force_insert=True)
                    a["spec"].save(force_insert=True)
                    rows.loop.save(force_insert=True)
                    rows.run.save(force_insert=True)
                    WorkflowStepRun.objects.bulk_create(rows.steps)
                    rows.event.save(force_insert=True)
                    a["item"].save(force_insert=True)
                    apply_load_delta(rows.load)
                    enqueue_run_workflow(rows.run.id)
                    now = timezone.now()
                    InboxEvent.objects.filter(pk=a["inbox"]).update(
                        state="admitted",
                        work_item=a["item"],
                        route_attempts=1,
                        routed_at=now,
                        updated_at=now,
                    )
        else:
            for start in range(0, count, CHUNK):
                chunk = admissions[start : start + CHUNK]
                with transaction.atomic():
                    WorkflowInvocation.objects.bulk_create(
                        [a["invocation"] for a in chunk]
                    )
                    WorkflowSpec.objects.bulk_create([a["spec"] for a in chunk])
                    Loop.objects.bulk_create([a["rows"].loop for a in chunk])
                    WorkflowWorkItem.objects.bulk_create([a["item"] for a in chunk])
                    WorkflowRun.objects.bulk_create([a["rows"].run for a in chunk])
                    WorkflowStepRun.objects.bulk_create(
                        [s for a in chunk for s in a["rows"].steps]
                    )
                    WorkflowEvent.objects.bulk_create([a["rows"].event for a in chunk])
                    load = LoadDelta()
                    for a in chunk:
                        load.add(a["rows"].load)
                    apply_load_delta(load)
                    for a in chunk:
                        enqueue_run_workflow(a["rows"].run.id)
                    now = timezone.now()
                    InboxEvent.objects.bulk_update(
                        [
                            InboxEvent(
                                pk=a["inbox"],
                                state="admitted",
                                work_item=a["item"],
                                route_attempts=1,
                                routed_at=now,
                                updated_at=now,
                            )
                            for a in chunk
                        ],
                        [
                            "state",
                            "work_item",
                            "route_attempts",
                            "routed_at",
                            "updated_at",
                        ],
                    )
    seconds = time.perf_counter() - started
    return {
        "events": count,
        "seconds": round(seconds, 3),
        "events_per_s": round(count / seconds, 1),
        "statements_per_event": round(counter.n / count, 2),
    }


RUNNER_RUNS = harness.scaled(20, 5)


def _runner_statements() -> dict[str, Any]:
    """Statements the runner sends for a 2-step (worker, verifier) run on the fake agent
    (no waiting: the accounts are free), from claim to finalize, per run."""
    import os
    import tempfile
    from pathlib import Path

    from django.conf import settings
    from django.db import connection

    from routing.admission import route_event, route_options
    from runs.runner import run_workflow_run

    fake = harness.ROOT / "scripts" / "fake-agent"
    settings.LOOPSWEB_PROVIDER_BINARIES = {
        p: str(fake)
        for p in ("codewith", "claude", "codex", "cursor", "opencode", "aicopilot")
    }
    os.environ["PATH"] = (
        f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    project = tempfile.mkdtemp(prefix="loopsweb-bench-runner-")
    # The agent really runs there: the project must lie inside the allowed roots.
    settings.LOOPSWEB_PROJECT_ROOTS = [project]
    counts = []
    for n in range(RUNNER_RUNS):
        result = route_event(
            kind="generic",
            envelope={
                "id": f"evt-runner-{n}",
                "type": "build.failed",
                "source": "ci",
                "data": {"project_path": project, "title": "Fix", "message": "broke"},
            },
            options=route_options({"auth_profile_pool": "acct-a,acct-b"}),
            env={},
        )
        assert result.run is not None, result.to_dict()
        counter = _Statements()
        with connection.execute_wrapper(counter):
            status = run_workflow_run(result.run.id)
        assert status == "succeeded", status
        counts.append(counter.n)
    return {
        "runs": RUNNER_RUNS,
        "statements_per_run": round(sum(counts) / len(counts), 1),
        "min": min(counts),
        "max": max(counts),
    }


def run_phase(name: str) -> None:
    db = harness.start(f"{NAME}_{name}")
    try:
        from django.conf import settings

        if name == "one_at_a_time":
            settings.LOOPSWEB_DRAIN_BATCH_SIZE = 1
        if name == "runner":
            result = _runner_statements()
        elif name in ("batched", "one_at_a_time"):
            _ingest(EVENTS, "t")
            result = _drain(EVENTS)
        elif name in ("floor_per_event", "floor_bulk"):
            _ingest(EVENTS, "floor")
            result = _floor(EVENTS, bulk=name == "floor_bulk")
        else:  # backlog: QUEUED runs queued by an earlier drain, then BACKLOG_EVENTS more
            from ledger.models import WorkflowRun

            _ingest(QUEUED, "q")
            _drain(QUEUED)
            _ingest(BACKLOG_EVENTS, "b")
            result = _drain(BACKLOG_EVENTS)
            result["queued_before"] = QUEUED
            assert WorkflowRun.objects.filter(status="queued").count() == (
                QUEUED + BACKLOG_EVENTS
            )
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        db.drop()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--phase":
        run_phase(sys.argv[2])
        return
    vendor = "postgresql" if harness.is_postgres(harness.server_url()) else "sqlite"
    report = harness.Report(
        NAME,
        f"Drains with runs piling up: {EVENTS:,} todos-task events, then {BACKLOG_EVENTS:,} "
        f"with {QUEUED:,} queued",
        vendor,
    )
    results: dict[str, dict[str, Any]] = {}
    for name in PHASES:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.bench.bench_backlog", "--phase", name],
            cwd=harness.child_cwd(),
            env=harness.child_env(),
            capture_output=True,
            text=True,
            timeout=3600,
        )
        lines = [
            line for line in proc.stdout.splitlines() if line.startswith("RESULT ")
        ]
        if proc.returncode != 0 or not lines:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
            raise SystemExit(f"backlog phase {name!r} failed")
        results[name] = json.loads(lines[-1][len("RESULT ") :])
        print(f"  {name}: {results[name]}", flush=True)
    report.data["phases"] = results
    drains = ("batched", "one_at_a_time", "backlog")
    report.table(
        "drains (no runner: every admitted run stays queued)",
        ["drain", "events", "queued before", "seconds", "events/s", "first ms/event",
         "last ms/event", "last/first", "statements/admitted"],
        [
            [n, results[n]["events"], results[n].get("queued_before", 0), results[n]["seconds"],
             results[n]["events_per_s"], results[n]["first_ms_per_event"],
             results[n]["last_ms_per_event"], results[n]["last_over_first"],
             results[n]["statements_per_admitted"]]
            for n in drains
        ],
    )  # fmt: skip
    report.table(
        "floors: the same rows, written without deciding",
        ["floor", "events", "seconds", "events/s", "statements/event"],
        [
            [n, results[n]["events"], results[n]["seconds"], results[n]["events_per_s"],
             results[n]["statements_per_event"]]
            for n in ("floor_per_event", "floor_bulk")
        ],
    )  # fmt: skip
    per_event = results["floor_per_event"]["events_per_s"]
    bulk = results["floor_bulk"]["events_per_s"]
    for n in drains:
        r = results[n]
        label = {
            "batched": f"batched drain, {EVENTS:,} events",
            "one_at_a_time": f"one-at-a-time drain, {EVENTS:,} events",
            "backlog": f"batched drain, {BACKLOG_EVENTS:,} events with {QUEUED:,} queued",
        }[n]
        report.figure(f"{label}: events/s", r["events_per_s"], "/s")
        report.figure(
            f"{label}: cost per event, last {WINDOW} / first {WINDOW}",
            r["last_over_first"],
            "x",
            "<= 1.2x",
            r["last_over_first"] <= 1.2,
        )
        report.figure(
            f"{label}: statements per admitted event",
            r["statements_per_admitted"],
            "",
            "<= 14",
            r["statements_per_admitted"] <= 14,
        )
        report.figure(
            f"{label}: per-event floor / drain",
            round(per_event / r["events_per_s"], 2),
            "x",
        )
        slower = bulk / r["events_per_s"]
        report.figure(
            f"{label}: bulk-insert floor / drain",
            round(slower, 2),
            "x",
            "<= 2x" if n != "one_at_a_time" else "",
            slower <= 2 if n != "one_at_a_time" else None,
        )
    runner = results["runner"]
    before = RUNNER_BEFORE[vendor]
    report.figure(
        f"runner statements per 2-step run (fake agent, {runner['runs']} runs; "
        f"{before} before)",
        runner["statements_per_run"],
        "",
        f"<= {before // 2} (half)",
        runner["statements_per_run"] <= before // 2,
    )
    report.finish()


if __name__ == "__main__":
    main()
