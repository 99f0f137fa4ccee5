"""Benchmark: what the agent sandbox (runs.sandbox) adds to a step's start.

One run, alternating: STARTS step processes through `runs.processes.run_process` exactly as
the runner starts them, with and without the sandbox (bwrap, its egress relay and the guard
as the namespace's first process), each running `/bin/true` in a worktree-like directory. The
figure is the step's wall time from `run_process` called to the result returned; the
difference is the start-up and tear-down the sandbox adds; the agent CLIs themselves take one to six seconds to
start. Target (docs/isolation.md §7): at most 100 ms added at p95 on the 2-core machine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.bench import harness

NAME = "sandbox"
STARTS = harness.scaled(60, 20)


def _once(work: Path, sandboxed: bool) -> float:
    from runs.processes import Limits, run_process
    from runs.providers import Invocation
    from runs.sandbox import step_sandbox

    box = (
        step_sandbox(
            provider="codex",
            binary="/bin/true",
            root=str(work),
            common_dir=None,
            account_env={},
        )
        if sandboxed
        else None
    )
    invocation = Invocation(
        argv=["/bin/true"],
        cwd=str(work),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        sandbox=box,
    )
    clock = time.perf_counter()
    result = run_process(
        invocation=invocation,
        limits=Limits(
            timeout_seconds=60, tail_bytes=65536, grace_seconds=1, keep_alive_every=60
        ),
    )
    elapsed = (time.perf_counter() - clock) * 1000
    if result.exit_code != 0:
        raise SystemExit(f"the step failed: {result.spawn_error or result.stderr}")
    return elapsed


def run(db: harness.BenchDatabase) -> None:
    from runs.sandbox import sandbox_problem

    report = harness.Report(
        NAME, f"Agent sandbox: step start, {STARTS} each", db.vendor
    )
    problem = sandbox_problem()
    if problem:
        raise SystemExit(problem)
    work = db.workdir / "worktree"
    work.mkdir()
    plain: list[float] = []
    boxed: list[float] = []
    _once(work, True)  # warm the page cache for bwrap and the guard
    for _ in range(STARTS):
        plain.append(_once(work, False))
        boxed.append(_once(work, True))
    rows = []
    for label, values in (("without the sandbox", plain), ("with the sandbox", boxed)):
        rows.append(
            [
                label,
                len(values),
                round(harness.median(values), 1),
                round(harness.percentile(values, 95), 1),
                round(max(values), 1),
            ]
        )
    report.table("step start to result, ms", ["", "n", "median", "p95", "max"], rows)
    added_p95 = harness.percentile(boxed, 95) - harness.percentile(plain, 95)
    added_med = harness.median(boxed) - harness.median(plain)
    report.figure("added at the median", round(added_med, 1), "ms")
    report.figure(
        "added at p95", round(added_p95, 1), "ms", "<= 100 ms", added_p95 <= 100
    )
    report.figure(
        "p95 with / p95 without",
        round(harness.percentile(boxed, 95) / harness.percentile(plain, 95), 2),
        "x",
    )
    report.note(
        "alternating starts of /bin/true in one process; the sandbox's include bwrap, the "
        "guard as the first process of the step's PID namespace with the egress relay's "
        "inside half, and the relay's outside half (threads of the runner)"
    )
    report.finish()


if __name__ == "__main__":
    harness.main(NAME, run)
