"""Benchmark 3: concurrent drains against every cap, and whether any cap was ever exceeded.

One inbox of 5,000 generic events over 8 projects (two project groups, two projects without
one) is drained by 8 processes at once, each calling `drain_run` in a loop exactly as the
scheduled drain task does, until the inbox is empty. The baseline is 1 process draining the
same inbox on a fresh database for BASELINE_SECONDS (its rate is steady after the first
drain, and draining all 5,000 alone would double the benchmark's run time). Caps: route scope 10,
project 3, project group 5, and a 5-account pool with --max-per-profile 2 — every one of them
binds at some point.

Work completes while the drains run: each admitted item "runs" for a fixed pseudo-random
0.05–0.40 s (derived from its id, so the same under 1 or 8 drainers), and one completer
process, standing in for the runner, finishes the items whose time is up (polling every 5 ms,
a conditional UPDATE per item). It is the same single process in every configuration, so
work completes at the same pace whatever the number of drainers. Finishing frees the item's
cap slots and its account, so the drains keep admitting until the inbox is empty.

Cap safety is checked three ways:
  - sampled: after every drain, each drainer counts active items per scope, project, group
    and account (unlocked reads, like tests/routing/admission/race_worker.py); any count above its cap
    is a violation;
  - end state: the same counts once all drainers have exited;
  - from the ledger, exactly: every admission's interval (run created → finished) is swept
    in time order per scope, project, group and account; an admission that starts while its
    dimension already holds `cap` items is an over-admission. Timestamps are taken inside the
    deciding transaction and before the finishing one, so the sweep never reports a false one.
Throughput: admissions per second from the go signal to the last admission, and, for the
8-to-1 comparison, over the same work: the first COMPARE_FIRST admissions of each run.
Three configurations: 1 drainer, 8 drainers of one scope (they take turns: one drain per
scope at a time), and 8 drainers with a scope each (their drains run at once and race for the
shared project, group and account caps under the admission lock).
Targets: zero over-admissions on both databases; 8 drainers at least as fast as 1.
"""

from __future__ import annotations

import hashlib
import json
import random
import select
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from tests.bench import harness

NAME = "drains"
EVENTS = harness.scaled(5_000, 300)
BASELINE_SECONDS = harness.scaled(90, 20)  # the 1-drainer run stops after this
COMPARE_FIRST = harness.scaled(
    3_000, 200
)  # throughput is compared over these admissions
# (drainers, one scope per drainer): 1 and 8 drainers of one scope (the 8 take turns: one
# drain per scope at a time), and 8 drainers of 8 scopes, whose drains do run at once and
# race for the shared project, group and account caps under the admission lock.
CONFIGS: dict[str, tuple[int, bool]] = {
    "1": (1, False),
    "8": (8, False),
    "8 scopes": (8, True),
}
SCOPE = "bench-drain"  # the scope, or the prefix of the 8 scopes
ACCOUNTS = ("acct-a", "acct-b", "acct-c", "acct-d", "acct-e")
PROJECTS: list[tuple[str, str | None]] = [
    ("/srv/drain/p1", "g1"), ("/srv/drain/p2", "g1"), ("/srv/drain/p3", "g1"),
    ("/srv/drain/p4", "g2"), ("/srv/drain/p5", "g2"), ("/srv/drain/p6", "g2"),
    ("/srv/drain/p7", None), ("/srv/drain/p8", None),
]  # fmt: skip
CAPS: dict[str, Any] = {
    "max_active": 10,
    "max_active_scope": SCOPE,
    "max_active_per_project": 3,
    "max_active_per_project_group": 5,
    "auth_profile_pool": ",".join(ACCOUNTS),
    "max_per_profile": 2,
}
DRAIN: dict[str, Any] = {"max_dispatch": 5, "limit": 20}
HOLD_MIN, HOLD_MAX = 0.05, 0.40  # seconds an admitted item stays active
COMPLETER_POLL = 0.005  # seconds between the completer's passes
# A drain that admitted nothing waits IDLE_SLEEP before the next (a scheduler would wait
# seconds); one that stepped aside for a running drain of its scope waits OVERLAP_SLEEP, the
# next tick of a scheduler that skips overlapping runs. Seven drainers polling every 20 ms
# would cost more CPU than the one draining on a 2-core machine.
IDLE_SLEEP = 0.02
OVERLAP_SLEEP = 0.1
DEADLINE = 900.0  # seconds; a guard, never reached in a healthy run


def hold_seconds(item_id: str) -> float:
    digest = int(hashlib.blake2b(item_id.encode(), digest_size=4).hexdigest(), 16)
    return HOLD_MIN + (digest / 0xFFFFFFFF) * (HOLD_MAX - HOLD_MIN)


# --- the benchmark (parent) -------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 4 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--completer":
        completer()
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--config":
        config(sys.argv[2])
        return
    vendor = "postgresql" if harness.is_postgres(harness.server_url()) else "sqlite"
    report = harness.Report(NAME, f"Concurrent drains: {EVENTS:,} inbox events", vendor)
    results: dict[str, dict[str, Any]] = {}
    for key in CONFIGS:
        # Each configuration runs in its own process on its own throwaway database.
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.bench.bench_drains",
                "--config",
                key,
            ],
            cwd=harness.child_cwd(),
            env=harness.child_env(),
            capture_output=True,
            text=True,
            timeout=DEADLINE + 300,
        )
        lines = [
            line for line in proc.stdout.splitlines() if line.startswith("RESULT ")
        ]
        if proc.returncode != 0 or not lines:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
            raise SystemExit(f"drain configuration {key!r} failed")
        results[key] = json.loads(lines[-1][len("RESULT ") :])
        print(f"  {key} drainer(s): done", flush=True)
    report.data["configs"] = results

    report.table(
        "drains",
        ["drainers", "admitted", "seconds", "admissions/s", "drains run", "overlap skips", "deduped",
         "held by pre-check", "throttled under lock", "max active scope/project/group/account"],
        [
            [n, r["admitted"], r["seconds"], r["admissions_per_s"], r["drains"], r["overlapped"], r["deduped"],
             r["prechecked"], r["throttled_locked"],
             "/".join(str(r["ledger"]["max_seen"][d]) for d in ("scope", "project", "group", "account"))]
            for n, r in results.items()
        ],
    )  # fmt: skip
    report.table(
        "cap exceeded (times)",
        ["drainers", "sampled checks", "sampled violations", "ledger sweep: scope",
         "project", "group", "account", "end state"],
        [
            [n, r["samples"], r["sampled_violations"], r["ledger"]["exceeded"]["scope"],
             r["ledger"]["exceeded"]["project"], r["ledger"]["exceeded"]["group"],
             r["ledger"]["exceeded"]["account"], r["end_state_violations"]]
            for n, r in results.items()
        ],
    )  # fmt: skip
    for n, r in results.items():
        exceeded = sum(r["ledger"]["exceeded"].values())
        total = exceeded + r["sampled_violations"] + r["end_state_violations"]
        report.figure(f"admissions/s with {n} drainer(s)", r["admissions_per_s"], "/s")
        report.figure(
            f"share of the cap ceiling with {n} drainer(s) "
            f"(slots / mean hold = {r['ceiling_per_s']}/s)",
            round(100 * r["admissions_per_s"] / r["ceiling_per_s"]),
            "%",
        )
        report.figure(
            f"cap exceeded with {n} drainer(s) (ledger + sampled + end state)",
            total,
            "times",
            "0",
            total == 0,
        )
        if n != "1":
            report.figure(
                f"all {EVENTS:,} events admitted with {n} drainers",
                f"{r['admitted']:,}",
                "",
                f"{EVENTS:,}",
                r["admitted"] == EVENTS,
            )
    if "1" in results and "8" in results:
        k = min(COMPARE_FIRST, results["1"]["admitted"], results["8"]["admitted"])
        one, eight = (k / results[n]["admitted_after_s"][k - 1] for n in ("1", "8"))
        ratio = eight / one
        report.figure(
            f"admissions/s over the first {k:,} admissions: 1 drainer, 8 drainers",
            f"{one:.1f}, {eight:.1f}",
            "/s",
        )
        report.figure(
            f"throughput 8 drainers / 1 drainer (first {k:,} admissions)",
            round(ratio, 2),
            "x",
            ">= 1.0x",
            ratio >= 1.0,
        )
    report.note(
        f"caps: scope {CAPS['max_active']}, project {CAPS['max_active_per_project']}, group "
        f"{CAPS['max_active_per_project_group']}, {len(ACCOUNTS)} accounts x max-per-profile "
        f"{CAPS['max_per_profile']}; drains: max_dispatch {DRAIN['max_dispatch']}, limit "
        f"{DRAIN['limit']}; items stay active {HOLD_MIN}-{HOLD_MAX} s"
    )
    report.note(
        f"the 1-drainer baseline drains the same {EVENTS:,}-event inbox for {BASELINE_SECONDS} s "
        "(its rate is steady); 8 drainers drain it to the end"
    )
    report.note(
        "8 drainers of one scope take turns (one drain per scope at a time, overlap skip); "
        f"'8 scopes' gives each drainer its own scope ({SCOPE}-0 … -7, cap "
        f"{CAPS['max_active']} each), so their drains run at once and race for the shared "
        "project, group and account caps"
    )
    report.note(
        "max active = the highest concurrent count the ledger sweep saw per dimension: "
        "equal to the cap means the cap was reached (contended), above it would be a violation"
    )
    report.finish()


def config(key: str) -> None:
    """One configuration on its own database: ingest, race the drainers, analyse."""
    drainers, split = CONFIGS[key]
    db = harness.start(f"{NAME}_{drainers}{'_split' if split else ''}")
    budget = BASELINE_SECONDS if drainers == 1 else DEADLINE
    try:
        from routing.drains.inbox import inbox_ingest

        envelopes = [(n, _envelope(n)) for n in range(EVENTS)]
        inbox_ingest(envelopes)

        def spawn(*args: str) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.bench.bench_drains", *args],
                cwd=harness.child_cwd(),
                env=harness.child_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

        workers = [
            spawn("--worker", str(i), str(budget), f"{SCOPE}-{i}" if split else SCOPE)
            for i in range(drainers)
        ]
        runner = spawn("--completer")
        for proc in [
            *workers,
            runner,
        ]:  # all have set Django up before the clock starts
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise SystemExit(
                    f"bench process failed to start: {line}{proc.communicate()[1][-3000:]}"
                )
        go = time.time()
        for proc in [*workers, runner]:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        tallies = []
        for proc in workers:
            out, err = proc.communicate(timeout=DEADLINE + 120)
            if proc.returncode != 0:
                raise SystemExit(f"drainer exited {proc.returncode}: {err[-3000:]}")
            tallies.append(json.loads(out.strip().splitlines()[-1]))
        out, err = runner.communicate("stop\n", timeout=120)
        if runner.returncode != 0:
            raise SystemExit(f"completer exited {runner.returncode}: {err[-3000:]}")
        print("RESULT " + json.dumps(analyse(go, tallies)), flush=True)
    finally:
        db.drop()


def _envelope(n: int) -> dict[str, Any]:
    rng = random.Random(n)
    project, group = PROJECTS[rng.randrange(len(PROJECTS))]
    data: dict[str, Any] = {
        "project_path": project,
        "message": f"build {n} failed",
        "title": f"CI {n}",
    }
    if group:
        data["project_group"] = group
    # Event ids unique in their first 8 characters (generic workflow names keep only those).
    return {"id": f"d{n:07d}", "type": "build.failed", "source": "ci", "data": data}


def analyse(go: float, tallies: list[dict[str, Any]]) -> dict[str, Any]:
    from ledger.models import WorkflowRun, WorkflowStepRun, WorkflowWorkItem

    items = {
        row["id"]: row
        for row in WorkflowWorkItem.objects.filter(
            route_scope__startswith=SCOPE
        ).values(
            "id",
            "route_scope",
            "project_key",
            "project_group",
            "status",
            "workflow_run_id",
        )
    }
    runs = list(
        WorkflowRun.objects.filter(work_item_id__in=list(items)).values(
            "id", "work_item_id", "created_at", "finished_at"
        )
    )
    first_accounts = {}
    for run_id, profile in WorkflowStepRun.objects.filter(
        workflow_run_id__in=[r["id"] for r in runs], sequence=0
    ).values_list("workflow_run_id", "account_profile"):
        first_accounts[run_id] = profile
    ledger = sweep(runs, items, first_accounts)
    admitted = len(runs)
    last = max((r["created_at"] for r in runs), default=None)
    seconds = (last.timestamp() - go) if last else float("nan")
    # The same work for every configuration: the first COMPARE_FIRST admissions. (Draining to
    # the end includes a tail where the few projects left hit their caps; the 1-drainer run
    # stops at its time budget before that.)
    starts = sorted(round(r["created_at"].timestamp() - go, 4) for r in runs)
    end_violations = len(violations_now())
    # With every scope slot always busy, items finish (and slots free) at cap / mean hold per
    # second: the most any number of drainers can admit. Where a run sits against it shows
    # whether the drains or the caps were the limit.
    holds = [hold_seconds(r["work_item_id"]) for r in runs]
    scopes = len({item["route_scope"] for item in items.values()})
    slots = min(
        CAPS["max_active"] * scopes, len(ACCOUNTS) * CAPS["max_per_profile"]
    )  # the scope caps, or the accounts: whichever holds fewer items at once
    ceiling = slots / (sum(holds) / len(holds)) if holds else float("nan")
    return {
        "ceiling_per_s": round(ceiling, 2),
        "drainers": len(tallies),
        "admitted": admitted,
        "seconds": round(seconds, 2),
        "admissions_per_s": round(admitted / seconds, 2) if seconds > 0 else 0.0,
        "admitted_after_s": starts,
        "drains": sum(t["drains"] for t in tallies),
        "overlapped": sum(t["overlapped"] for t in tallies),
        "deduped": sum(t["deduped"] for t in tallies),
        "prechecked": sum(t["prechecked"] for t in tallies),
        "throttled_locked": sum(t["throttled"] - t["prechecked"] for t in tallies),
        "fatal": sum(t["fatal"] for t in tallies),
        "samples": sum(t["samples"] for t in tallies),
        "sampled_violations": sum(len(t["violations"]) for t in tallies),
        "violation_examples": [v for t in tallies for v in t["violations"]][:10],
        "end_state_violations": end_violations,
        "ledger": ledger,
        "per_drainer_created": [t["created"] for t in tallies],
    }


def sweep(
    runs: list[dict[str, Any]],
    items: dict[str, dict[str, Any]],
    first_accounts: dict[str, str | None],
) -> dict[str, Any]:
    """Replay admissions and completions in time order; count admissions over a cap."""
    caps = {
        "scope": CAPS["max_active"],
        "project": CAPS["max_active_per_project"],
        "group": CAPS["max_active_per_project_group"],
        "account": CAPS["max_per_profile"],
    }
    timeline: list[tuple[datetime, int, dict[str, str]]] = []
    far = datetime.max.replace(tzinfo=runs[0]["created_at"].tzinfo) if runs else None
    for run in runs:
        item = items[run["work_item_id"]]
        keys = {"scope": item["route_scope"], "project": item["project_key"]}
        if item["project_group"]:
            keys["group"] = item["project_group"]
        if first_accounts.get(run["id"]):
            keys["account"] = first_accounts[run["id"]]
        # Ends sort before starts at the same instant (0 < 1): a slot freed at t is free at t.
        timeline.append((run["created_at"], 1, keys))
        timeline.append((run["finished_at"] or far, 0, keys))
    timeline.sort(key=lambda e: (e[0], e[1]))
    active: Counter[tuple[str, str]] = Counter()
    exceeded = dict.fromkeys(caps, 0)
    max_seen = dict.fromkeys(caps, 0)
    for _, starts, keys in timeline:
        for dim, key in keys.items():
            if starts:
                if active[(dim, key)] >= caps[dim]:
                    exceeded[dim] += 1
                active[(dim, key)] += 1
                max_seen[dim] = max(max_seen[dim], active[(dim, key)])
            else:
                active[(dim, key)] -= 1
    return {"exceeded": exceeded, "max_seen": max_seen, "caps": caps}


# --- one drainer (child) ----------------------------------------------------------------------


def violations_now() -> list[str]:
    """Counts above a cap right now (each count one statement, so one consistent snapshot)."""
    from django.db.models import Count

    from ledger.models import ACTIVE_WORK_ITEM_STATUSES, WorkflowWorkItem
    from ledger.selectors import account_load

    found = []
    active = WorkflowWorkItem.objects.filter(status__in=ACTIVE_WORK_ITEM_STATUSES)
    for field, cap in (
        ("route_scope", "max_active"),
        ("project_key", "max_active_per_project"),
        ("project_group", "max_active_per_project_group"),
    ):
        for key, n in (
            active.exclude(**{f"{field}__isnull": True})
            .values_list(field)
            .annotate(n=Count("id"))
            .order_by()
        ):
            if n > CAPS[cap]:
                found.append(f"{field} {key} {n}")
    for account, n in account_load().total().items():
        if n > CAPS["max_per_profile"]:
            found.append(f"account {account} {n}")
    return found  # fmt: skip


def finish_due(now: datetime) -> int:
    """Finish every active bench item whose hold time is up; returns how many this process won."""
    from django.db import transaction

    from ledger.models import (
        ACTIVE_WORK_ITEM_STATUSES,
        WorkflowRun,
        WorkflowStepRun,
        WorkflowWorkItem,
    )
    from ledger.services.account_loads import apply_load_delta, load_change, run_load

    rows = WorkflowWorkItem.objects.filter(
        status__in=ACTIVE_WORK_ITEM_STATUSES, route_scope__startswith=SCOPE
    ).values_list("id", "workflow_run_id", "workflow_run__created_at")
    won = 0
    for item_id, run_id, admitted_at in rows:
        if (
            admitted_at is None
            or admitted_at + timedelta(seconds=hold_seconds(item_id)) > now
        ):
            continue
        with transaction.atomic():
            # The finish time is taken before this transaction commits, so an admission that
            # sees the freed slot always starts after it (the sweep relies on that order).
            done = datetime.now(tz=now.tzinfo)
            changed = WorkflowWorkItem.objects.filter(
                pk=item_id, status__in=ACTIVE_WORK_ITEM_STATUSES
            ).update(status="succeeded", updated_at=done)
            if changed:
                # The run ends: release the load it kept on its accounts
                # (ledger.services.account_loads).
                steps = list(WorkflowStepRun.objects.filter(workflow_run_id=run_id))
                apply_load_delta(
                    load_change(run_load("queued", steps), run_load(None, []))
                )
                WorkflowRun.objects.filter(pk=run_id).update(
                    status="succeeded", finished_at=done, updated_at=done
                )
                WorkflowStepRun.objects.filter(workflow_run_id=run_id).update(
                    status="succeeded", updated_at=done
                )
                won += 1
    return won


def completer() -> None:
    """The runner's part: finish every item whose hold time is up, polling every 5 ms, until
    the parent writes "stop". One process in every configuration, so work completes at the
    same pace whatever the number of drainers."""
    harness.attach()
    from django.utils import timezone

    print("ready", flush=True)
    sys.stdin.readline()  # "go"
    finished = 0
    while True:
        finished += finish_due(timezone.now())
        readable, _, _ = select.select([sys.stdin], [], [], COMPLETER_POLL)
        if readable:
            sys.stdin.readline()  # "stop"
            break
    print(json.dumps({"finished": finished}), flush=True)


def worker(index: int, budget: float, scope: str) -> None:
    harness.attach()
    from routing.drains import drain_options, drain_run
    from routing.models import OPEN_INBOX_STATES, InboxEvent

    options = drain_options("generic", {**CAPS, "max_active_scope": scope, **DRAIN})
    print("ready", flush=True)
    sys.stdin.readline()  # "go"
    tally: dict[str, Any] = {
        "worker": index, "drains": 0, "overlapped": 0, "created": 0, "deduped": 0, "throttled": 0,
        "prechecked": 0, "fatal": 0, "samples": 0, "violations": [],
    }  # fmt: skip
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        report = drain_run(options=options, env={})
        if report.overlapped:  # another drainer is draining this scope
            tally["overlapped"] += 1
            time.sleep(OVERLAP_SLEEP)
            continue
        tally["drains"] += 1
        for kind in ("created", "deduped", "throttled", "fatal"):
            tally[kind] += report.counts[kind]
        tally["prechecked"] += sum(1 for r in report.results if r.get("precheck"))
        tally["samples"] += 1
        tally["violations"] += violations_now()
        if (
            report.scanned == 0
            and not InboxEvent.objects.filter(state__in=OPEN_INBOX_STATES).exists()
        ):
            break
        if report.counts["created"] == 0:
            time.sleep(IDLE_SLEEP)
    print(json.dumps(tally), flush=True)


if __name__ == "__main__":
    main()
