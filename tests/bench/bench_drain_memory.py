"""Benchmark 4: peak memory of one drain that scans 100,000 inbox events.

The inbox holds 100,000 pending generic events over 40 projects. Every pool account is
already at --max-per-profile (the seeded live set: 12 accounts × 2), so the drain holds back
every candidate it considers: the first after its pre-check (three cap counts, then the
pool), and, since the pool is the drain's own (--auth-profile-pool, shared by every
candidate), the rest unread. It scans the whole inbox window, fair-orders it and considers
`limit` candidates without admitting any (max_dispatch 5 is never reached). That is the
drain's worst case for memory: every scanned row is alive at once, the `limit` chosen ones
with their envelopes, plus one result per considered candidate.

The drain runs in a fresh child process (`--child`): its peak RSS (`ru_maxrss`) is what the
drain needs on top of a Django process, with nothing the parent did (seeding) counted. The
child also reports its RSS right after Django set-up, before the drain, for the baseline.
Target: peak RSS under 300 MB.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any

from tests.bench import harness

NAME = "drain_memory"
INBOX = harness.scaled(100_000, 1_000)
CONSIDER = harness.scaled(5_000, 200)  # candidates considered (all held)
TARGET_MB = 300


def _options() -> dict[str, Any]:
    from tests.bench.seed import ACCOUNTS

    return {
        # Count caps that pass, so every candidate also reaches the pool pre-check, where
        # every account is full (the seeded live set carries 2 per account).
        "max_active": 1_000,
        "max_active_per_project": 1_000,
        "max_active_per_project_group": 1_000,
        "auth_profile_pool": ",".join(ACCOUNTS),
        "max_per_profile": 2,
        "max_dispatch": 5,
        "limit": CONSIDER,
        "scan_limit": INBOX,
    }


def _rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _vm_hwm_mb() -> float:
    """This program's own peak RSS (VmHWM restarts at exec), a cross-check of ru_maxrss."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def seed_child() -> None:
    harness.attach()
    from tests.bench import seed

    seed.seed_history(0, seed.ACTIVE_ITEMS)  # the live set: every pool account at 2
    seed.seed_inbox(INBOX, state="pending", prefix="mem")
    seed.after_bulk_load()


def child() -> None:
    harness.attach()
    from django.db import connection

    from routing.drains import drain_options, drain_run

    options = drain_options("generic", _options())
    with (
        connection.cursor() as cursor
    ):  # connect before the baseline, as a worker would be
        cursor.execute("SELECT 1")
    baseline = _rss_mb()
    started = time.monotonic()
    report = drain_run(options=options, env={})
    seconds = time.monotonic() - started
    held = sum(1 for r in report.results if r.get("precheck"))
    print(
        json.dumps(
            {
                "baseline_mb": round(baseline, 1),
                "peak_mb": round(_rss_mb(), 1),
                "vm_hwm_mb": round(_vm_hwm_mb(), 1),
                "scanned": report.scanned,
                "candidates": report.candidates,
                "considered": report.counts["considered"],
                "created": report.counts["created"],
                "held_by_precheck": held,
                "fatal": report.counts["fatal"],
                "seconds": round(seconds, 1),
                "reason_codes": sorted(
                    {str(r.get("reasonCode")) for r in report.results}
                ),
            }
        ),
        flush=True,
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--seed":
        seed_child()
        return
    db = harness.start(NAME)
    try:
        run(db.vendor)
    finally:
        db.drop()


def run(vendor: str) -> None:
    report = harness.Report(
        NAME, f"Drain memory: one drain scanning {INBOX:,} events", vendor
    )
    # Seed in another process: on Linux a child's ru_maxrss starts at its parent's peak RSS
    # (kept across fork and exec), so this process must stay small until the probe starts.
    seeding = harness.run_child(
        ["-m", "tests.bench.bench_drain_memory", "--seed"], timeout=1800
    )
    if seeding.returncode != 0:
        sys.stderr.write(seeding.stderr[-5000:])
        raise SystemExit("drain memory seeding failed")
    print(f"  seeded {INBOX:,} pending inbox events", flush=True)
    report.data["parent_peak_mb_at_spawn"] = round(_rss_mb(), 1)
    proc = harness.run_child(
        ["-m", "tests.bench.bench_drain_memory", "--child"], timeout=1800
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit("drain memory child failed")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    report.data["child"] = result
    report.table(
        "one drain",
        ["scanned", "candidates", "considered", "held by pre-check", "created", "seconds",
         "RSS after setup (MB)", "peak RSS (MB)", "VmHWM (MB)", "drain's share (MB)"],
        [[result["scanned"], result["candidates"], result["considered"],
          result["held_by_precheck"], result["created"], result["seconds"],
          result["baseline_mb"], result["peak_mb"], result["vm_hwm_mb"],
          round(result["peak_mb"] - result["baseline_mb"], 1)]],
    )  # fmt: skip
    report.figure(
        f"peak RSS of a drain scanning {result['scanned']:,} events",
        result["peak_mb"],
        "MB",
        f"< {TARGET_MB} MB",
        result["peak_mb"] < TARGET_MB,
    )
    report.figure(
        "events scanned",
        result["scanned"],
        "",
        f"{INBOX:,}",
        result["scanned"] == INBOX,
    )
    if result["considered"]:
        report.figure(
            "time per considered (held) candidate",
            round(result["seconds"] * 1000 / result["considered"], 2),
            "ms",
        )
    report.note(
        "peak RSS = the probe process's ru_maxrss; the parent stayed at "
        f"{report.data['parent_peak_mb_at_spawn']} MB, the floor a child's ru_maxrss inherits"
    )
    report.note(
        f"max_dispatch 5, limit {CONSIDER:,} considered, scan_limit {INBOX:,}; every pool "
        "account at --max-per-profile 2, so each considered candidate is held (the first after "
        "its pre-check, the rest unread: the pool is shared by every candidate)"
    )
    report.finish()


if __name__ == "__main__":
    main()
