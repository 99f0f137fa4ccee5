"""Benchmark 12: window budgets (issue 41), with the REAL codex: provider 429s and the time
until every task succeeded, with the window rule ON (`--max-window-used 0.9`, the default:
threshold and prediction, domain.windows rule 3) and OFF (`--max-window-used off`, rule 9:
the windows are not looked at, today's least-loaded rule as before windows existed), side
by side in one run.

Three codex accounts behind the provider stand-in (tests/agents/provider.py), which sends
codex's `x-codex-*` window headers: each answered model call adds `BENCH_WINDOWS_STEP` (0.16)
to its account's 5-hour used fraction; past 100 % the account gets 429s
(`usage_limit_reached`, with the reset) until the stand-in's window resets, every
`BENCH_WINDOWS_RESET` seconds (20) from its first request. A codex step answers two model
calls (the tool call, then the final text), so a step spends 0.32: three steps take an
account to 96 %, which the rule on counts as spent until the reset (and the prediction,
a step's spend read from the step runs' observations, holds a fourth step at 96 % + 32 % >
100 %, as it holds a second step on an account at 64 %); with the rule off the fourth step
is admitted, its first call takes the account past 100 % and its second gets a 429 (the
runner then cools the account until the reset and moves the step).

`BENCH_WINDOWS_TASKS` tasks (30; the issue's size is 60; 6 at BENCH_SCALE=small) are
ingested as todos tasks, each in its own git project, and drained through `drain_run` with
`--max-active 3` over the pool of the three accounts, once a second until every task has a
run; a real run cluster (`Q_CLUSTER_NAME=loopsweb-runs manage.py qcluster`, 3 workers) runs
the steps. Per mode: the stand-in's 429s, the wall time from the first drain until every
run ended, and the runs' statuses. Target: 0 provider 429s with the rule on, and no more
time than with the rule off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.bench import harness

NAME = "windows"
TASKS = int(os.environ.get("BENCH_WINDOWS_TASKS") or harness.scaled(30, 6))
STEP = float(os.environ.get("BENCH_WINDOWS_STEP") or 0.16)
RESET_SECONDS = int(os.environ.get("BENCH_WINDOWS_RESET") or 20)
MODES = (("rule on", "0.9"), ("rule off", "off"))
ACCOUNTS = ("a", "b", "c")
DEADLINE_SECONDS = 1200


def _git_project(path: Path) -> Path:
    path.mkdir(parents=True)
    for argv in (
        ["init", "-q", "-b", "main"],
        ["-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q",
         "--allow-empty", "-m", "initial"],
    ):  # fmt: skip
        subprocess.run(["git", "-C", str(path), *argv], check=True)
    return path


def _ingest(tag: str, projects: Path) -> None:
    from routing.drains.inbox import inbox_ingest

    events = []
    for n in range(TASKS):
        project = _git_project(projects / f"{tag}-{n}")
        events.append(
            (
                n,
                {
                    "id": f"evt-windows-{tag}-{n}",
                    "type": "task.created",
                    "source": "@hasna/todos",
                    "data": {
                        "id": f"WIN-{tag}-{n}",
                        "title": "Write agent-output.txt",
                        "description": "Write the file agent-output.txt in the working "
                        "directory.",
                        "tags": ["auto:route"],
                        "project_path": str(project),
                    },
                },
            )
        )
    inbox_ingest(events)


def _runs(tag: str) -> list[tuple[str, str]]:
    """(status, error) of this mode's runs."""
    from ledger.models import WorkflowWorkItem

    return list(
        WorkflowWorkItem.objects.filter(
            idempotency_key__startswith=f"todos-task:WIN-{tag}-",
            workflow_run__isnull=False,
        ).values_list("workflow_run__status", "workflow_run__error")
    )


def _mode(tag: str, max_used: str, db: harness.BenchDatabase) -> dict[str, Any]:
    """One mode on a fresh stand-in and three fresh accounts; its figures."""
    from domain import reasons
    from ledger.models import RunStatus
    from routing.drains import drain_options, drain_run
    from tests.agents import clis
    from tests.agents.provider import ProviderStandIn

    stand_in = ProviderStandIn(window_step=STEP, window_reset_seconds=RESET_SECONDS)
    keys = {f"{tag}-{a}": f"bench-key-{tag}-{a}" for a in ACCOUNTS}
    stand_in.windows = dict.fromkeys(keys.values(), 0.0)
    stand_in.start()
    try:
        home = db.workdir / tag
        home.mkdir()
        for name, key in keys.items():
            clis.register_account("codex", name, stand_in, home, key=key)
        _ingest(tag, db.projects_dir)
        options = drain_options(
            "todos-task",
            {
                "provider": "codex",
                "auth_profile_pool": ",".join(keys),
                "max_active": 3,
                "max_dispatch": 3,
                "max_window_used": max_used,
            },
        )
        active = (RunStatus.QUEUED, RunStatus.RUNNING)
        started = time.monotonic()
        deadline = started + DEADLINE_SECONDS
        deferred = 0
        while time.monotonic() < deadline:
            runs = _runs(tag)
            if len(runs) == TASKS and not any(s in active for s, _ in runs):
                break
            if len(runs) < TASKS:
                report = drain_run(options=options, env={})
                deferred += sum(
                    1
                    for r in report.results
                    if r.get("reasonCode") == reasons.WINDOW_EXHAUSTED
                )
            time.sleep(1.0)
        else:
            raise SystemExit(f"{tag}: not every run ended in {DEADLINE_SECONDS} s")
        seconds = time.monotonic() - started
    finally:
        stand_in.stop()
    statuses: dict[str, int] = {}
    for status, _ in runs:
        statuses[status] = statuses.get(status, 0) + 1
    refused = [r for r in stand_in.requests if r.refused == 429]
    return {
        "429s": len(refused),
        "seconds": round(seconds, 1),
        "statuses": statuses,
        "errors": sorted({e for s, e in runs if s != RunStatus.SUCCEEDED and e}),
        "model_calls": len(stand_in.model_calls()),
        "window_deferrals": deferred,
    }


def run(db: harness.BenchDatabase) -> None:
    from tests.agents import clis

    report = harness.Report(
        NAME,
        "Window budgets: provider 429s and drain time, rule on / off",
        db.vendor,
    )
    try:
        cli_bin = clis.install_clis("tests/bench/bench_windows.py")
    except BaseException as exc:  # pytest.skip where npm is absent
        raise SystemExit(f"the codex CLI is not available: {exc}") from None
    env = harness.child_env()
    env.update(
        Q_CLUSTER_NAME="loopsweb-runs",
        LOOPSWEB_RUN_WORKERS="3",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        LOOPSWEB_CODEX_BIN=str(cli_bin / clis.CLI_PACKAGES["codex"][2]),
    )
    log = db.workdir / "qcluster.log"
    cluster = harness.start_qcluster(env, log)
    results: dict[str, dict[str, Any]] = {}
    try:
        for n, (label, max_used) in enumerate(MODES):
            results[label] = _mode(f"m{n}", max_used, db)
            print(f"  {label}: {results[label]}", flush=True)
    except SystemExit:
        sys.stderr.write(f"run cluster log (last 3,000 characters):\n{log.read_text()[-3000:]}\n")  # fmt: skip
        raise
    finally:
        harness.stop_process_group(cluster)
    on, off = (results[label] for label, _ in MODES)
    report.table(
        f"{TASKS} tasks, --max-active 3, 3 codex accounts, +{STEP:.2f} per model call, "
        f"window reset every {RESET_SECONDS} s",
        [
            "--max-window-used",
            "provider 429s",
            "all runs ended (s)",
            "runs",
            "model calls",
            "window_exhausted deferrals",
        ],
        [
            [
                f"{max_used} ({label})",
                results[label]["429s"],
                results[label]["seconds"],
                ", ".join(
                    f"{k} {v}" for k, v in sorted(results[label]["statuses"].items())
                ),
                results[label]["model_calls"],
                results[label]["window_deferrals"],
            ]
            for label, max_used in MODES
        ],
    )
    # The target is the rule on's: all its runs succeeded, in no more time than off took.
    succeeded = set(on["statuses"]) == {"succeeded"}
    report.figure("provider 429s, rule on", on["429s"], "", "0", on["429s"] == 0)
    report.figure("provider 429s, rule off", off["429s"], "", "", None)
    report.figure(
        "all tasks succeeded, rule on (s)",
        on["seconds"],
        "s",
        f"<= rule off ({off['seconds']} s)",
        succeeded and on["seconds"] <= off["seconds"],
    )
    report.figure("all tasks succeeded, rule off (s)", off["seconds"], "s", "", None)
    for label, _ in MODES:
        if results[label]["errors"]:
            report.note(f"{label}: errors of the runs that did not succeed: {results[label]['errors']}")  # fmt: skip
    report.note(
        "The REAL codex against the stand-in on loopback; the drain runs in the benchmark's "
        "process once a second (max 3 admissions each); the run cluster polls its broker "
        "every 0.5 s. One stand-in, fresh accounts and fresh projects per mode, the modes "
        "one after the other on the same run cluster."
    )
    report.finish()


if __name__ == "__main__":
    harness.main(NAME, run)
