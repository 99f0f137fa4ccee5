"""Benchmark: from an event's ingest to its agent's process starting, on one host.

Both clusters run for real (`manage.py qcluster`: the main one with its 2 workers, which fires
schedules and runs drains; the run cluster with 8), the fake agent exits at once. A drain
schedule takes generic events every 60 minutes; it fires once at its creation and not again
within the benchmark, so what admits an ingested event is the wake-up its ingest sends
(routing/drains/wake.py). Three paths, each EVENTS events:

- `ingest, spaced`: `inbox_ingest` (what the API without `route=now` and `ingest_events` call)
  of one event every PACE s: each wakes the schedule's drain on its own;
- `ingest, burst`: waves of WAVE events BURST_PACE s apart (faster than
  LOOPSWEB_INGEST_WAKE_SECONDS, so most ride on a drain another one woke: at most one per
  second per schedule), a wave every WAVE_PACE s; a wave fits the run workers, so the
  figure is the wake-up's, not a queue of runs (the goal holds "with free capacity");
- `route=now`: the admission the API's `route=now` makes in the request (`route_event` in
  this process; the inbox row it also stores is left out): the floor of the other two.

For each event: the time from the ingest's commit (the call's return) to the first agent
process of its run starting (the record's name carries the agent's clock).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

from tests.bench import harness
from tests.bench.bench_run_latency import start_run_cluster

NAME = "ingest_start"
EVENTS = harness.scaled(40, 8)
PACE = 1.5  # s between two spaced ingests: more than the wake spacing (1 s)
BURST_PACE = 0.1  # s between two burst ingests
WAVE = 8  # burst ingests in a row (the run cluster's 8 workers)
WAVE_PACE = 4.0  # s from one wave's last ingest to the next wave
SCHEDULE = "bench-wake"


def _start_main_cluster(log: Path) -> Any:
    env = harness.child_env()
    env.update(Q_WORKERS="2")
    return harness.start_qcluster(env, log)


def _event(path: str, n: int, project: Path) -> dict[str, Any]:
    return {
        "id": f"evt-{path}-{n}-{time.time_ns()}",
        "type": "build.failed",
        "source": "bench",
        "data": {"project_path": str(project), "title": f"Fix {path} {n}"},
    }


def _ingest_path(
    path: str, pace: float, project: Path
) -> tuple[dict[str, float], dict[str, str]]:
    """Ingest EVENTS events `pace` s apart: event id -> the moment its ingest committed, and
    run id -> event id of the runs admitted in the call (route=now)."""
    from routing.admission import CREATED, route_event, route_options
    from routing.drains.inbox import inbox_ingest

    options = route_options({"max_active": 100_000})
    sent: dict[str, float] = {}
    routed: dict[str, str] = {}
    for n in range(EVENTS):
        event = _event(path, n, project)
        if path == "route=now":
            result = route_event(
                kind="generic", envelope=event, options=options, env={}
            )
            assert result.kind == CREATED, result.kind
            routed[str(result.run.id)] = event["id"]
        else:
            inbox_ingest([("1", event)])
        sent[event["id"]] = time.time()
        time.sleep(pace if pace >= 1 or (n + 1) % WAVE else WAVE_PACE)
    return sent, routed


def _starts(
    sent: dict[str, float], routed: dict[str, str], records: Path
) -> list[float]:
    """Seconds from each event's ingest to its run's first agent process, once all ran."""
    from ledger.models import RunStatus, WorkflowRun
    from routing.models import InboxEvent

    def run_events() -> dict[str, str]:
        """run id -> the event it was admitted for."""
        items = dict(
            InboxEvent.objects.filter(
                event_id__in=list(sent), work_item__isnull=False
            ).values_list("work_item_id", "event_id")
        )
        return routed or {
            run_id: items[item_id]
            for run_id, item_id in WorkflowRun.objects.filter(
                work_item_id__in=list(items)
            ).values_list("id", "work_item_id")
        }

    harness.wait_for(
        lambda: (
            len(run_events()) == len(sent)
            and not WorkflowRun.objects.filter(
                status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
            ).exists()
        ),
        timeout=600,
        what="every event's run to finish",
    )
    by_run = run_events()
    first: dict[str, float] = {}
    for record_path in records.glob("*.json"):
        record = json.loads(record_path.read_text())
        run_id = record["env"].get("LOOPSWEB_RUN_ID")
        started = int(record_path.name.split("-", 1)[0]) / 1e9
        if run_id in by_run:
            first[run_id] = min(first.get(run_id, started), started)
    return [first[r] - sent[by_run[r]] for r in first]


def _print_state() -> None:
    """What the ledger and the queue hold, when the benchmark gives up."""
    from django.db.models import Count
    from django_q.models import OrmQ, Task

    from ledger.models import WorkflowRun
    from routing.models import InboxEvent

    runs = WorkflowRun.objects.values("status").annotate(n=Count("id"))
    inbox = InboxEvent.objects.values("state").annotate(n=Count("id"))
    tasks = Task.objects.values("func", "success").annotate(n=Count("id"))
    print(f"runs {list(runs)}\ninbox {list(inbox)}\ntasks {list(tasks)}")
    print(f"queued tasks {OrmQ.objects.count()}")


def run(db: harness.BenchDatabase) -> None:
    from django.core.management import call_command

    from routing.models import DrainRecord

    report = harness.Report(
        NAME, f"Ingest to agent start, {EVENTS} events per path", db.vendor
    )
    work = db.workdir
    records, project = work / "records", db.projects_dir / "project"
    records.mkdir()
    project.mkdir()
    logs = (work / "main.log", work / "runs.log")
    main = _start_main_cluster(logs[0])
    runs = start_run_cluster(records, logs[1])
    figures: dict[str, list[float]] = {}
    try:
        call_command(
            "schedule_drain",
            SCHEDULE,
            "generic",
            "--every",
            "60m",
            "--max-active",
            "100000",
            "--max-dispatch",
            "100000",
            stdout=io.StringIO(),
        )
        harness.wait_for(
            lambda: DrainRecord.objects.filter(name=SCHEDULE).exists(),
            timeout=120,
            what="the schedule's first drain",
        )
        for path, pace in (
            ("route=now", PACE),
            ("ingest, spaced", PACE),
            ("ingest, burst", BURST_PACE),
        ):
            sent, routed = _ingest_path(path, pace, project)
            figures[path] = [1000 * s for s in _starts(sent, routed, records)]
    except SystemExit:
        _print_state()
        for log in logs:
            print(f"{log.name} (last 3,000 characters):\n{log.read_text()[-3000:]}")
        raise
    finally:
        harness.stop_process_group(runs)
        harness.stop_process_group(main)
    rows = [
        [path, len(ms), harness.median(ms), harness.percentile(ms, 95), max(ms)]
        for path, ms in figures.items()
    ]
    report.table("ingest → first agent process (ms)", ["path", "n", "median", "p95", "max"], rows)  # fmt: skip
    floor = harness.median(figures["route=now"])
    for path, ms in figures.items():
        p95 = harness.percentile(ms, 95)
        met = p95 <= 2000 if path != "route=now" else None
        report.figure(f"{path}: p95", round(p95, 1), "ms", "≤ 2000" if met is not None else "", met)  # fmt: skip
        report.figure(f"{path}: median / route=now median", round(harness.median(ms) / floor, 2), "x")  # fmt: skip
        report.figure(f"{path}: runs", len(ms), "", str(EVENTS), len(ms) == EVENTS)
    report.note(
        f"one host; main cluster 2 workers, run cluster 8, broker poll 0.5 s; the schedule "
        f"fires every 60 minutes (so only wake-ups admit), LOOPSWEB_INGEST_WAKE_SECONDS 1; "
        f"spaced {PACE} s apart; bursts of {WAVE} {BURST_PACE} s apart, {WAVE_PACE} s "
        "between bursts; the fake agent exits at once."
    )
    report.finish()


if __name__ == "__main__":
    harness.main(NAME, run)
