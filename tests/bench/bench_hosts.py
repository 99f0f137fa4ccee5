"""Benchmark 7: runs on 1, 2 and 3 hosts (issue 27), in one benchmark run.

Each simulated host is a run cluster of its own (`Q_CLUSTER_NAME=loopsweb-runs qcluster`)
with its own LOOPSWEB_HOST_NAME, data directory and worktree directory, serving the same
project root, all against the throwaway database. For N = 1, 2, 3 hosts: start them, wait
until each has registered (ledger.hosts), admit RUNS generic events at once (`route_event`,
each run placed on the least-loaded host), and time until every run ended. The fake agent
sleeps AGENT_SLEEP seconds per step.

Figures per N: runs/s (runs / wall time from the first admission to the last run's end),
agent starts/s (agent processes started / the span between the first and last start), the
split of runs over the hosts, and, on PostgreSQL, the connections each host holds (sampled
from pg_stat_activity every 0.5 s by application name: PGAPPNAME per host): peak while
running, and idle after the runs ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.bench import harness

NAME = "hosts"
RUNS = harness.scaled(120, 24)
WORKERS = 4  # run workers per host
AGENT_SLEEP = "0.2"
FAKE_AGENT = harness.ROOT / "scripts" / "fake-agent"
PROVIDERS = ("codewith", "claude", "codex", "cursor", "opencode", "aicopilot")


def start_host(
    work: Path,
    name: str,
    root: Path,
    records: Path,
    *,
    workers: int = WORKERS,
    **extra: str,
) -> subprocess.Popen[bytes]:
    base = work / name
    (base / "data").mkdir(parents=True, exist_ok=True)
    env = harness.child_env()
    env.update(
        Q_CLUSTER_NAME="loopsweb-runs",
        LOOPSWEB_HOST_NAME=name,
        LOOPSWEB_DATA_DIR=str(base / "data"),
        LOOPSWEB_WORKTREE_DIR=str(base / "worktrees"),
        LOOPSWEB_PROJECT_ROOTS=str(root),
        LOOPSWEB_RUN_WORKERS=str(workers),
        PGAPPNAME=f"bench-{name}",
        FAKE_AGENT_RECORD_DIR=str(records),
        FAKE_AGENT_SLEEP=AGENT_SLEEP,
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        **{f"LOOPSWEB_{p.upper()}_BIN": str(FAKE_AGENT) for p in PROVIDERS},
        **extra,
    )
    return harness.start_qcluster(env, (base / "qcluster.log"))


class _Connections:
    """Connections per host (application name), sampled from pg_stat_activity."""

    def __init__(self, vendor: str) -> None:
        self.enabled = vendor == "postgresql"
        self.peak: Counter[str] = Counter()
        self.last: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Counter[str]:
        from django.db import connections

        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'bench-%%' "
                "GROUP BY 1"
            )
            return Counter({name: int(n) for name, n in cursor.fetchall()})

    def _loop(self) -> None:
        from django.db import connections

        try:
            while not self._stop.wait(0.5):
                self.last = self.sample()
                for name, n in self.last.items():
                    self.peak[name] = max(self.peak[name], n)
        finally:
            connections.close_all()

    def start(self) -> None:
        if self.enabled:
            self.peak, self.last = Counter(), Counter()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None


def _one(
    db: harness.BenchDatabase, hosts: int, root: Path, conns: _Connections
) -> dict[str, Any]:
    from ledger.hosts import hosts_read_forget
    from ledger.models import Host, RunStatus, WorkflowRun
    from routing.admission import CREATED, route_event, route_options

    work = db.workdir / f"hosts-{hosts}"
    records = work / "records"
    records.mkdir(parents=True)
    names = [f"h{hosts}-{n}" for n in range(1, hosts + 1)]
    procs = [start_host(work, name, root, records) for name in names]
    try:
        harness.wait_for(
            lambda: set(Host.objects.values_list("name", flat=True)) >= set(names),
            timeout=120,
            what=f"{hosts} host(s) to register",
        )
        time.sleep(3)  # every worker up and reporting
        hosts_read_forget()
        # Earlier rounds' hosts are gone: only this round's may take runs.
        Host.objects.exclude(name__in=names).delete()
        hosts_read_forget()
        conns.start()
        options = route_options({"max_active": 100_000})
        started = time.monotonic()
        ids = []
        for i in range(RUNS):
            result = route_event(
                kind="generic",
                envelope={
                    "id": f"evt-hosts-{hosts}-{i}-{time.time_ns()}",
                    "type": "build.failed",
                    "source": "bench",
                    "data": {
                        "project_path": str(root / "project"),
                        "title": f"Fix {i}",
                    },
                },
                options=options,
                env={},
            )
            assert result.kind == CREATED, result.kind
            ids.append(result.run.id)
        harness.wait_for(
            lambda: (
                not WorkflowRun.objects.filter(
                    id__in=ids, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
                ).exists()
            ),
            timeout=900,
            what="every run to finish",
        )
        wall = time.monotonic() - started
        time.sleep(12)  # idle: a heartbeat or more after the last run
        conns.stop()
        idle = conns.sample() if conns.enabled else Counter()
    finally:
        conns.stop()
        for proc in procs:
            harness.stop_process_group(proc)
    rows = WorkflowRun.objects.filter(id__in=ids)
    failed = rows.exclude(status=RunStatus.SUCCEEDED).count()
    split = Counter(rows.values_list("host", flat=True))
    starts = sorted(int(p.name.split("-", 1)[0]) / 1e9 for p in records.glob("*.json"))
    span = starts[-1] - starts[0] if len(starts) > 1 else float("nan")
    return {
        "hosts": hosts,
        "runs": RUNS,
        "failed": failed,
        "wall": wall,
        "runs_per_s": RUNS / wall,
        "agent_starts": len(starts),
        "starts_per_s": (len(starts) - 1) / span if span == span and span else 0.0,
        "split": [split.get(n, 0) for n in names],
        "peak": [conns.peak.get(f"bench-{n}", 0) for n in names],
        "idle": [idle.get(f"bench-{n}", 0) for n in names],
    }


def run(db: harness.BenchDatabase) -> None:
    report = harness.Report(
        NAME, f"Several hosts: {RUNS} runs on 1, 2 and 3 hosts", db.vendor
    )
    root = db.projects_dir
    (root / "project").mkdir(parents=True)
    conns = _Connections(db.vendor)
    results = [_one(db, n, root, conns) for n in (1, 2, 3)]
    report.table(
        f"{RUNS} two-step runs, {WORKERS} run workers per host, agent sleeps {AGENT_SLEEP} s",
        [
            "hosts",
            "runs/s",
            "agent starts/s",
            "wall s",
            "runs per host",
            "PG connections per host, peak",
            "idle",
        ],
        [
            [
                r["hosts"],
                round(r["runs_per_s"], 2),
                round(r["starts_per_s"], 2),
                round(r["wall"], 1),
                "/".join(map(str, r["split"])),
                "/".join(map(str, r["peak"])) if conns.enabled else "n/a",
                "/".join(map(str, r["idle"])) if conns.enabled else "n/a",
            ]
            for r in results
        ],
    )
    for r in results:
        report.figure(f"runs/s, {r['hosts']} host(s)", round(r["runs_per_s"], 2), "/s")
        report.figure(
            f"agent starts/s, {r['hosts']} host(s)", round(r["starts_per_s"], 2), "/s"
        )
        if conns.enabled:
            report.figure(
                f"PG connections per host at peak, {r['hosts']} host(s)",
                max(r["peak"]),
                "",
            )
    failed = sum(r["failed"] for r in results)
    report.figure("runs that did not succeed", failed, "", "0", failed == 0)
    report.figure(
        "every host took runs",
        "yes" if all(min(r["split"]) > 0 for r in results) else "no",
        "",
        "yes",
        all(min(r["split"]) > 0 for r in results),
    )
    report.note(json.dumps(results))
    report.finish()


if __name__ == "__main__":
    harness.main(NAME, run)
