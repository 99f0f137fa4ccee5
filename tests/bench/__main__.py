"""`make bench` (python -m tests.bench [name ...]): run the benchmarks and summarise them.

Each benchmark runs in its own process on its own throwaway database (tests/bench/harness.py)
and prints its tables; at the end every figure is listed again with its target and whether it
was met, and the whole run lands in tests/bench/results/summary-<backend>.{json,md}. Missed
targets are reported, not failures: the exit status is non-zero only when a benchmark could
not run.

    make bench                                   # SQLite, full scale (1M-item ledger)
    BENCH_SCALE=small make bench                 # sizes / 100, a quick check
    DATABASE_URL=postgres://u@host:5432/db make bench   # creates and drops bench_* dbs there
    .venv/bin/python -m tests.bench admission pages     # a subset, in this order
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.bench import harness

# (name, module). Admission comes before pages: it hands its seeded 1M ledger over.
BENCHMARKS: list[tuple[str, str]] = [
    ("admission", "tests.bench.bench_admission"),
    ("drains", "tests.bench.bench_drains"),
    ("backlog", "tests.bench.bench_backlog"),
    ("drain_memory", "tests.bench.bench_drain_memory"),
    ("pages", "tests.bench.bench_pages"),
    ("run_latency", "tests.bench.bench_run_latency"),
    ("ingest_start", "tests.bench.bench_ingest_start"),
    ("revision_start", "tests.bench.bench_revision_start"),
    ("failover", "tests.bench.bench_failover"),
    ("failover_opencode", "tests.bench.bench_failover_opencode"),
    ("hosts", "tests.bench.bench_hosts"),
    ("idle", "tests.bench.bench_idle"),
    ("windows", "tests.bench.bench_windows"),
    ("sandbox", "tests.bench.bench_sandbox"),
    ("storm", "tests.bench.bench_storm"),
]


def main(argv: list[str]) -> int:
    chosen = argv or [name for name, _ in BENCHMARKS]
    unknown = sorted(set(chosen) - {name for name, _ in BENCHMARKS})
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from "
              f"{', '.join(n for n, _ in BENCHMARKS)}", file=sys.stderr)  # fmt: skip
        return 2
    url = harness.server_url()
    vendor = "postgresql" if harness.is_postgres(url) else "sqlite"
    machine = harness.machine_info(vendor)
    print(
        f"loopsweb benchmarks: {', '.join(chosen)} on {vendor}, scale={harness.SCALE}"
    )
    print(
        f"machine: {machine['nproc']} cpu ({machine['cpu']}), {machine['ram_gib']} GiB, "
        f"Python {machine['python']}, SQLite {machine['sqlite']}"
        + (
            f", PostgreSQL {machine.get('postgresql')}"
            if vendor == "postgresql"
            else ""
        )
        + f"; load average {machine['loadavg']}"
    )
    if machine["other_busy_processes"]:
        print(f"other busy processes: {', '.join(machine['other_busy_processes'])}")
    sys.stdout.flush()

    env = harness.child_env()  # PYTHONPATH: `-m` imports the project from another cwd
    env[harness.SERVER_URL_ENV] = url
    token = f"handover_{os.getpid()}"
    if "admission" in chosen and "pages" in chosen:
        env[harness.HANDOVER_ENV] = token
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    try:
        for name, module in BENCHMARKS:
            if name not in chosen:
                continue
            result_file = harness.RESULTS_DIR / f"{name}.json"
            result_file.unlink(missing_ok=True)  # never summarise a stale result
            print(f"\n>>> {name} ({module})", flush=True)
            clock = time.monotonic()
            code = subprocess.call(
                [sys.executable, "-m", module], cwd=harness.child_cwd(), env=env
            )
            runs.append(
                {
                    "name": name,
                    "exit": code,
                    "seconds": round(time.monotonic() - clock, 1),
                    "result": json.loads(result_file.read_text())
                    if code == 0 and result_file.exists()
                    else None,
                }
            )
            if code != 0:
                print(f"!!! {name} failed (exit {code})", flush=True)
    finally:
        harness.discard_handover(token)
    total = time.monotonic() - started
    machine_end = harness.machine_info(vendor)
    summary = {
        "vendor": vendor,
        "scale": harness.SCALE,
        "total_seconds": round(total, 1),
        "machine": machine,
        "loadavg_at_end": machine_end["loadavg"],
        "other_busy_processes_at_end": machine_end["other_busy_processes"],
        "benchmarks": runs,
    }
    write_summary(summary)
    return 0 if all(r["exit"] == 0 for r in runs) else 1


def write_summary(summary: dict[str, Any]) -> None:
    rows = []
    for run in summary["benchmarks"]:
        if run["result"] is None:
            rows.append([run["name"], "(benchmark failed)", "-", "-", "-"])
            continue
        for fig in run["result"]["figures"]:
            rows.append(
                [
                    run["name"],
                    fig["name"],
                    harness.format_value(fig["value"], fig["unit"]),
                    fig["target"] or "-",
                    {True: "met", False: "MISSED", None: "-"}[fig["met"]],
                ]
            )
    print()
    print(
        f"== every figure [{summary['vendor']}, scale={summary['scale']}, "
        f"{summary['total_seconds'] / 60:.1f} min] =="
    )
    harness.print_table(
        "figures", ["benchmark", "figure", "value", "target", "result"], rows
    )
    missed = [r for r in rows if r[4] == "MISSED"]
    print(f"\n  {len(missed)} target(s) missed; per-benchmark seconds: "
          + ", ".join(f"{r['name']} {r['seconds']:.0f}" for r in summary["benchmarks"]))  # fmt: skip
    harness.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    # One summary per backend, so a SQLite and a PostgreSQL run sit side by side.
    stem = f"summary-{summary['vendor']}"
    (harness.RESULTS_DIR / f"{stem}.json").write_text(
        json.dumps(summary, indent=2, default=str) + "\n"
    )
    machine = summary["machine"]
    lines = [
        f"# loopsweb benchmarks ({summary['vendor']}, scale={summary['scale']})",
        "",
        f"- total: {summary['total_seconds'] / 60:.1f} min",
        f"- machine: {machine['nproc']} cpu ({machine['cpu']}), {machine['ram_gib']} GiB RAM, "
        f"Python {machine['python']}, SQLite {machine['sqlite']}"
        + (
            f", PostgreSQL {machine.get('postgresql')}"
            if "postgresql" in machine
            else ""
        ),
        f"- load average at start {machine['loadavg']}, at end {summary['loadavg_at_end']}",
        f"- other busy processes at start: {', '.join(machine['other_busy_processes']) or 'none'}",
        "",
        "| benchmark | figure | value | target | result |",
        "|---|---|---|---|---|",
        *[f"| {' | '.join(str(c) for c in row)} |" for row in rows],
        "",
    ]
    path: Path = harness.RESULTS_DIR / f"{stem}.md"
    path.write_text("\n".join(lines))
    print(f"  summary: {path.relative_to(harness.ROOT)} (and {stem}.json)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
