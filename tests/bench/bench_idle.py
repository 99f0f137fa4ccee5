"""Benchmark 10: what one idle run cluster costs PostgreSQL (issue 44).

One run cluster (`Q_CLUSTER_NAME=loopsweb-runs qcluster`, WORKERS run workers, a host of its
own) is started on the throwaway database and left with nothing to do. After SETTLE seconds
(every worker up and past its first heartbeat), the server's own counters for this database
are read twice, WINDOW seconds apart (`pg_stat_database`: `sessions`, the connections opened,
and `xact_commit + xact_rollback`, transactions: each autocommit statement is one). The
benchmark process itself holds one connection and reads twice. Measured once with
DATABASE_CONN_MAX_AGE=0 (a connection per broker poll and per heartbeat) and once with the
clusters' default (persistent connections with health checks, loopsweb.settings).

PostgreSQL only (SQLite has no connections to count).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.bench import harness
from tests.bench.bench_hosts import start_host

NAME = "idle"
WORKERS = 8  # LOOPSWEB_RUN_WORKERS' default
SETTLE = harness.scaled(20, 15)
WINDOW = harness.scaled(60, 20)


def _counters() -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT sessions, xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        )
        sessions, xacts = cursor.fetchone()
    return int(sessions), int(xacts)


def _one(db: harness.BenchDatabase, label: str, **env: str) -> dict[str, Any]:
    from ledger.models import Host

    work = db.workdir / f"idle-{label}"
    records = work / "records"
    records.mkdir(parents=True)
    name = f"idle-{label}"
    proc = start_host(work, name, db.projects_dir, records, workers=WORKERS, **env)
    try:
        harness.wait_for(
            lambda: Host.objects.filter(name=name).exists(),
            timeout=120,
            what="the run cluster to register",
        )
        time.sleep(SETTLE)
        sessions0, xacts0 = _counters()
        started = time.monotonic()
        time.sleep(WINDOW)
        sessions1, xacts1 = _counters()
        span = time.monotonic() - started
    finally:
        harness.stop_process_group(proc)
    return {
        "setting": label,
        "window_s": round(span, 1),
        "connections_per_s": round((sessions1 - sessions0) / span, 2),
        # the benchmark's own two reads (3 statements each) are taken out
        "transactions_per_s": round((xacts1 - xacts0 - 3) / span, 2),
    }


def run(db: harness.BenchDatabase) -> None:
    report = harness.Report(
        NAME, "One idle run cluster: connections and statements", db.vendor
    )
    if db.vendor != "postgresql":
        report.note("PostgreSQL only: nothing measured on SQLite")
        report.finish()
        return
    Path(db.projects_dir).mkdir(parents=True, exist_ok=True)
    results = [
        _one(db, "max-age-0", DATABASE_CONN_MAX_AGE="0"),
        _one(db, "default"),
    ]
    report.table(
        f"one idle run cluster, {WORKERS} run workers, {WINDOW} s window after {SETTLE} s",
        ["DATABASE_CONN_MAX_AGE", "new connections/s", "transactions/s"],
        [
            [r["setting"], r["connections_per_s"], r["transactions_per_s"]]
            for r in results
        ],
    )
    for r in results:
        report.figure(
            f"new connections/s, idle run cluster ({r['setting']})",
            r["connections_per_s"],
            "/s",
            "<= 0.5" if r["setting"] == "default" else "",
            r["connections_per_s"] <= 0.5 if r["setting"] == "default" else None,
        )
        report.figure(
            f"transactions/s, idle run cluster ({r['setting']})",
            r["transactions_per_s"],
            "/s",
        )
    report.finish()


if __name__ == "__main__":
    harness.main(NAME, run)
