"""Benchmark: a quota storm, a pool of 4 whose rate-limit windows run out and reset on a
compressed clock, with a backlog far larger than the pool's capacity.

The agent is the windows stand-in tests/bench/storm_agent.py as the claude binary (it runs
scripts/fake-agent for the step's work, `BENCH_STORM_STEP` seconds, 0.5): each account
answers `BENCH_STORM_CAPACITY` requests (steps; 5, 2 at BENCH_SCALE=small) per window of
`BENCH_STORM_WINDOW` seconds (30; 20), the four accounts' windows staggered by a quarter
window; a request past the capacity gets claude's 429 for a spent
window, naming its reset, and every answered one prints the window's state as claude's
`rate_limit_event` does (`rejected` once the capacity is used).

Real processes throughout: the accounts registered with `manage.py account add`
(claude), `BENCH_STORM_ITEMS` todos tasks (200; 20 at BENCH_SCALE=small), each in its own
git project, loaded with `manage.py ingest_events`, a run cluster (`Q_CLUSTER_NAME=loopsweb-
runs manage.py qcluster`, 4 workers), and `manage.py drain todos-task` over the pool
(`--max-active 8 --max-dispatch 8`, the product's defaults otherwise but
LOOPSWEB_THROTTLE_SECONDS, `BENCH_STORM_THROTTLE`, 0: see THROTTLE) started every
`BENCH_STORM_DRAIN_EVERY` seconds (3) until every item ended. Each item is a worker and a
verifier step: two requests when all goes well. `python -m tests.bench storm` runs it alone.

Figures and goals:
1. items failed or dead-lettered for quota (a rate limit, a spent window, a parked task,
   a whole-pool wait that ended): 0;
2. requests sent to an account before its reset (the stand-in refused them: the account's
   window was spent): 0; of them, those sent after a finished request on that account had
   already reported the window spent (loopsweb had been told): 0. Beside them, read from
   the ledger while the storm runs: the refused requests sent while loopsweb held a
   `rejected` row of the account's window, and the requests whose output said the window
   was spent (the last answered one, or a 429) that left no `rejected` row;
3. from the earliest reset to the first dispatch: for each stretch in which every account's
   window was spent (the stand-in's truth) while work was left, the time from the stretch's
   end (the earliest reset) to the first request the pool answered; the worst: at most one
   drain interval. The first admission after the same reset is reported beside it;
4. delivered work as a share of the pool's scripted capacity: requests answered in the
   account windows that began after the storm started and ended before the last item was
   admitted (a backlog waited all along), over the capacity of those windows: >= 90 %.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.bench import harness, storm_figures

NAME = "storm"
ITEMS = int(os.environ.get("BENCH_STORM_ITEMS") or harness.scaled(200, 20))
CAPACITY = int(os.environ.get("BENCH_STORM_CAPACITY") or harness.scaled(5, 2))
WINDOW = int(os.environ.get("BENCH_STORM_WINDOW") or harness.scaled(30, 20))
DRAIN_EVERY = float(os.environ.get("BENCH_STORM_DRAIN_EVERY") or 3)
STEP_SECONDS = os.environ.get("BENCH_STORM_STEP") or "0.5"
# LOOPSWEB_THROTTLE_SECONDS, compressed with the clock: a 429 whose reset is at most this
# far off is a per-minute limit (the step pauses on its account). A spent 5-hour window
# resets hours off, so the rule never applies to it; here every window resets within
# seconds, and the product's default (20) would take each spent window for a per-minute
# limit. 0: every 429 is an exhausted window, as at full length.
THROTTLE = os.environ.get("BENCH_STORM_THROTTLE") or "0"
ACCOUNTS = ("storm-a", "storm-b", "storm-c", "storm-d")
MAX_ACTIVE = 8
RUN_WORKERS = 4
STORM_AGENT = Path(__file__).resolve().parent / "storm_agent.py"
POOL = storm_figures.Pool(ACCOUNTS, CAPACITY, WINDOW)
# What a quota failure's reason says (the runner's, the claims', the pool wait's wording).
QUOTA = re.compile(
    r"rate.?limit|usage limit|429|quota|window|every account|pool", re.IGNORECASE
)
ACTIVE = ("queued", "running")


def _manage(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, str(harness.ROOT / "manage.py"), *args],
        cwd=harness.child_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"manage.py {' '.join(args[:2])}: exit {done.returncode}\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return done.stdout


def _git_project(path: Path) -> Path:
    path.mkdir(parents=True)
    for argv in (
        ["init", "-q", "-b", "main"],
        ["-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q",
         "--allow-empty", "-m", "initial"],
    ):  # fmt: skip
        subprocess.run(["git", "-C", str(path), *argv], check=True)
    return path


def _setup(db: harness.BenchDatabase, env: dict[str, str]) -> None:
    """The pool's accounts, the projects and the inbox, each through manage.py."""
    for name in ACCOUNTS:
        home = db.workdir / "homes" / name
        home.mkdir(parents=True)
        _manage(env, "account", "add", name, "--provider", "claude",
                "--claude-config-dir", str(home))  # fmt: skip
    lines = []
    for n in range(ITEMS):
        project = _git_project(db.projects_dir / f"storm-{n}")
        envelope = {
            "id": f"evt-storm-{n}",
            "type": "task.created",
            "source": "@hasna/todos",
            "data": {
                "id": f"STORM-{n}",
                "title": "Write agent-output.txt",
                "description": "Write the file agent-output.txt.",
                "tags": ["auto:route"],
                "project_path": str(project),
            },
        }
        lines.append(json.dumps(envelope))
    events = db.workdir / "events.jsonl"
    events.write_text("\n".join(lines) + "\n")
    _manage(env, "ingest_events", str(events))


def _items() -> list[tuple[str, str, str]]:
    """(status, reason code, reason) of every storm item, with its latest run's error."""
    from ledger.models import WorkflowWorkItem

    rows = WorkflowWorkItem.objects.filter(
        idempotency_key__startswith="todos-task:STORM-"
    ).values_list("status", "reason_code", "last_reason", "workflow_run__error")
    return [
        (status, code or "", " ".join(filter(None, [reason, error])))
        for status, code, reason, error in rows
    ]


def _all_ended() -> bool:
    from ledger.models import TERMINAL_WORK_ITEM_STATUSES, WorkflowRun

    items = _items()
    return (
        len(items) == ITEMS
        and all(status in TERMINAL_WORK_ITEM_STATUSES for status, _, _ in items)
        and not WorkflowRun.objects.filter(status__in=ACTIVE).exists()
    )


def _window_rows(rows: dict[str, dict[str, Any]]) -> None:
    """Add the pool's window rows loopsweb holds now to `rows` (by id): read during the
    storm, since each account keeps only its newest rows (ledger.windows)."""
    from ledger.models import AccountWindow

    for row in AccountWindow.objects.filter(account_profile__in=ACCOUNTS).values(
        "id",
        "account_profile",
        "window",
        "status",
        "resets_at",
        "observed_at",
        "step_run_id",
    ):
        rows.setdefault(row["id"], dict(row))


def _drain_loop(
    env: dict[str, str], deadline: float, rows: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], bool]:
    """`manage.py drain` every DRAIN_EVERY s until every item ended: (the drains, ended);
    loopsweb's window rows are gathered into `rows` meanwhile."""
    argv = ["drain", "todos-task", "--provider", "claude",
            "--auth-profile-pool", ",".join(ACCOUNTS), "--max-active", str(MAX_ACTIVE),
            "--max-dispatch", str(MAX_ACTIVE), "--json", "--compact"]  # fmt: skip
    drains: list[dict[str, Any]] = []
    while time.time() < deadline:
        _window_rows(rows)
        if _all_ended():
            return drains, True
        started = time.time()
        report = json.loads(_manage(env, *argv) or "{}")
        drains.append(
            {
                "start": started,
                "end": time.time(),
                "created": report.get("created", 0),
                "held": report.get("heldReason"),
                # Why each item it did not admit waited (window_exhausted, profile_cap, …).
                "reasons": [
                    r["reasonCode"]
                    for r in report.get("results") or []
                    if r.get("reasonCode") and r.get("kind") != "created"
                ],
            }
        )
        time.sleep(max(0.0, started + DRAIN_EVERY - time.time()))
    return drains, False


def _unrecorded(
    requests: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> tuple[int, int]:
    """(requests whose output said the window is spent, of them those loopsweb kept no
    `rejected` window row of: same step of the same run, same account), each of them
    marked `recorded` or not."""
    from ledger.models import WorkflowStepRun

    steps = dict(
        (pk, (run, step))
        for pk, run, step in WorkflowStepRun.objects.filter(
            pk__in={row["step_run_id"] for row in rows if row["step_run_id"]}
        ).values_list("pk", "workflow_run_id", "step_id")
    )
    recorded = {
        (*steps[row["step_run_id"]], row["account_profile"])
        for row in rows
        if row["step_run_id"] in steps and row["status"] == "rejected"
    }
    spent = [r for r in requests if storm_figures.spent_report(POOL, r)]
    for r in spent:
        r["recorded"] = (r["run"], r["step"], r["account"]) in recorded
    return len(spent), sum(1 for r in spent if not r["recorded"])


def _step_events(request: dict[str, Any]) -> list[str]:
    """The last events of a refused request's step before it (what led loopsweb there)."""
    from ledger.models import WorkflowEvent

    events = WorkflowEvent.objects.filter(
        workflow_run_id=request["run"],
        step_id=request["step"],
        created_at__lte=datetime.fromtimestamp(request["start"], UTC),
    ).order_by("-sequence")[:4]
    return [
        f"{e.created_at.timestamp() - request['start']:+.2f} s {e.event_type} "
        f"{(e.payload_json or {}).get('code') or ''}".strip()
        for e in reversed(list(events))
    ]


def _admissions() -> tuple[list[float], float | None]:
    """(every storm run's creation, epoch s; when the last item was first admitted)."""
    from django.db.models import Min

    from ledger.models import WorkflowRun

    runs = WorkflowRun.objects.filter(
        work_item__idempotency_key__startswith="todos-task:STORM-"
    )
    created = [t.timestamp() for t in runs.values_list("created_at", flat=True)]
    firsts = runs.values("work_item_id").annotate(first=Min("created_at"))
    last = max((row["first"].timestamp() for row in firsts), default=None)
    return sorted(created), last


def _environment(db: harness.BenchDatabase, epoch: int) -> dict[str, str]:
    env = harness.child_env()
    env.update(
        LOOPSWEB_AGENT_SANDBOX="off",  # the stand-in's state lives outside any worktree
        LOOPSWEB_THROTTLE_SECONDS=THROTTLE,
        LOOPSWEB_CLAUDE_BIN=str(STORM_AGENT),
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        FAKE_AGENT_SLEEP=STEP_SECONDS,
        FAKE_AGENT_STORM_DIR=str(db.workdir / "storm"),
        FAKE_AGENT_STORM_ACCOUNTS=",".join(ACCOUNTS),
        FAKE_AGENT_STORM_EPOCH=str(epoch),
        FAKE_AGENT_STORM_WINDOW=str(WINDOW),
        FAKE_AGENT_STORM_CAPACITY=str(CAPACITY),
    )
    (db.workdir / "storm").mkdir()
    return env


def _storm(db: harness.BenchDatabase) -> dict[str, Any]:
    """Set up, run the storm to its end (or the deadline) and gather what happened."""
    env = _environment(db, 0)
    _setup(db, env)
    expected = math.ceil(2 * ITEMS / (len(ACCOUNTS) * CAPACITY)) * WINDOW
    deadline_s = 2 * expected + 300
    epoch = math.ceil(time.time())
    env["FAKE_AGENT_STORM_EPOCH"] = str(epoch)
    log = db.workdir / "qcluster.log"
    cluster = harness.start_qcluster(
        {
            **env,
            "Q_CLUSTER_NAME": "loopsweb-runs",
            "LOOPSWEB_RUN_WORKERS": str(RUN_WORKERS),
        },
        log,
    )
    rows: dict[str, dict[str, Any]] = {}
    try:
        drains, ended = _drain_loop(env, epoch + deadline_s, rows)
    except SystemExit:
        sys.stderr.write(f"run cluster log (last 3,000 characters):\n{log.read_text()[-3000:]}\n")  # fmt: skip
        raise
    finally:
        harness.stop_process_group(cluster)
    seconds = time.time() - epoch
    admissions, backlog_end = _admissions()
    return {
        "epoch": epoch,
        "seconds": seconds,
        "deadline_s": deadline_s,
        "ended": ended,
        "drains": drains,
        "requests": storm_figures.read_requests(db.workdir / "storm"),
        "items": _items(),
        "admissions": admissions,
        "backlog_end": backlog_end,
        "rows": list(rows.values()),
    }


def _tally(keys: Any) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items())


def _counts(keys: Any) -> str:
    return ", ".join(f"{k} {v}" for k, v in _tally(keys)) or "none"


def _tables(report: harness.Report, s: dict[str, Any], f: dict[str, Any]) -> None:
    requests, drains, resumes = s["requests"], s["drains"], f["resumes"]
    spacing = [
        b["start"] - a["start"] for a, b in zip(drains, drains[1:], strict=False)
    ]
    rows: list[list[Any]] = [
        ["wall time (s)", round(s["seconds"], 1)],
        ["every item ended", "yes" if s["ended"] else f"no ({s['deadline_s']:.0f} s)"],
        ["items by status", _counts(status for status, _, _ in s["items"])],
        ["runs created", len(s["admissions"])],
        ["requests answered", sum(1 for r in requests if r["answered"])],
        ["requests refused (429)", f["refused"]],
        ["  sent while loopsweb held a `rejected` row", f["known"]],
        ["    and its newest row said so", f["newest"]],
        ["requests saying the window is spent", f["spent_reports"]],
        ["  that left no `rejected` row", f["unrecorded"]],
        ["drains", len(drains)],
        ["drain spacing, median (s)", round(harness.median(spacing), 1)],
        ["drain deferrals", _counts(c for d in drains for c in d["reasons"])],
        ["whole-pool stretches with work left", len(resumes)],
        [
            "  their length, median (s)",
            round(harness.median([r[0] for r in resumes]), 1),
        ],
        ["windows counted for the share", f["windows"]],
        [
            "  requests answered in them / capacity",
            f"{f['delivered']} / {f['capacity']}",
        ],
    ]
    report.table(
        f"{ITEMS} items, a pool of {len(ACCOUNTS)} claude accounts, {CAPACITY} requests "
        f"per {WINDOW} s window each (staggered), a drain every {DRAIN_EVERY:g} s",
        ["what", "value"],
        rows,
    )
    reasons = [f"{code}: {reason[:160]}" for _, code, reason in f["lost"]]
    if reasons:
        report.table(
            "failed or dead-lettered items by reason",
            ["items", "reason"],
            [[n, reason] for reason, n in _tally(reasons)],
        )


def _figures(s: dict[str, Any]) -> dict[str, Any]:
    from ledger.models import TERMINAL_WORK_ITEM_STATUSES, WorkItemStatus

    requests, items = s["requests"], s["items"]
    lost = [
        item
        for item in items
        if item[0] in (WorkItemStatus.FAILED, WorkItemStatus.DEAD_LETTER)
    ]
    refused, told, known, newest = storm_figures.refused(POOL, requests, s["rows"])
    spent_reports, unrecorded = _unrecorded(requests, s["rows"])
    delivered, capacity, windows = (
        storm_figures.share(POOL, requests, s["epoch"], s["backlog_end"])
        if s["backlog_end"]
        else (0, 0, 0)
    )
    return {
        "lost": lost,
        "quota": sum(1 for _, code, reason in lost if QUOTA.search(f"{code} {reason}")),
        "unfinished": ITEMS
        - sum(1 for item in items if item[0] in TERMINAL_WORK_ITEM_STATUSES),
        "refused": refused,
        "told": told,
        "known": known,
        "newest": newest,
        "spent_reports": spent_reports,
        "unrecorded": unrecorded,
        "resumes": storm_figures.resumes(POOL, requests, s["admissions"]),
        "delivered": delivered,
        "capacity": capacity,
        "windows": windows,
    }


def _report(report: harness.Report, s: dict[str, Any]) -> None:
    f = _figures(s)
    _tables(report, s, f)
    resumes = f["resumes"]
    worst = max((r[1] for r in resumes), default=float("nan"))
    admitted = [r[2] for r in resumes if r[2] is not None]
    share = 100.0 * f["delivered"] / f["capacity"] if f["capacity"] else float("nan")
    for name, value, met in (
        ("items failed or dead-lettered for quota", f["quota"], f["quota"] == 0),
        ("items not ended at the deadline", f["unfinished"], f["unfinished"] == 0),
        ("requests sent to an account before its reset", f["refused"], f["refused"] == 0),
        ("  of them after the account reported the window spent", f["told"], f["told"] == 0),
    ):  # fmt: skip
        report.figure(name, value, "", "0", met)
    report.figure(
        "earliest reset → first dispatch, worst",
        round(worst, 2),
        "s",
        f"<= {DRAIN_EVERY:g} s (one drain interval)",
        bool(resumes) and worst <= DRAIN_EVERY,
    )
    report.figure(
        "earliest reset → first admission, worst",
        round(max(admitted, default=float("nan")), 2),
        "s",
    )
    report.figure(
        "delivered work / the pool's scripted capacity",
        round(share, 1),
        "%",
        ">= 90 %",
        f["capacity"] > 0 and share >= 90.0,
    )
    report.data.update(
        {k: v for k, v in f.items() if k != "lost"},
        drains=s["drains"],
        lost=f["lost"],
        epoch=s["epoch"],
        # Each refusal and each spent-window report loopsweb kept no row of, to look into.
        requests=[
            {**r, "events": [] if r["answered"] else _step_events(r)}
            for r in s["requests"]
            if not r["answered"] or r.get("recorded") is False
        ],
    )
    report.note(
        "The stand-in's clock: account i's windows reset at epoch + k × window + "
        "round(i × window / 4). A dispatch is a request the pool answered (a refused one "
        "counts as a request before its reset). The share counts the windows that began "
        "after the storm started and ended by the last item's first admission ("
        f"{datetime.fromtimestamp(s['backlog_end'] or 0, UTC):%H:%M:%S} UTC). Rows and "
        "refusals are timed by the agent's start, which comes after loopsweb's step start."
    )
    report.note(
        f"fake agent steps of {STEP_SECONDS} s; a run cluster of {RUN_WORKERS} workers; "
        f"LOOPSWEB_THROTTLE_SECONDS {THROTTLE} (the per-minute rule, compressed with the "
        "clock); "
        "the drains are `manage.py drain` processes, one at a time, each started an "
        "interval after the previous one began (or when it ended); the agent sandbox is "
        "off (the stand-in keeps its count outside the worktrees)."
    )


def run(db: harness.BenchDatabase) -> None:
    report = harness.Report(
        NAME,
        "A quota storm: a pool of 4 whose windows run out and reset",
        db.vendor,
    )
    storm = _storm(db)
    _report(report, storm)
    report.finish()


if __name__ == "__main__":
    harness.main(NAME, run)
