"""Start an agent the way the runner does (the adapter's argv, env and cwd; no shell; the step
guard; the step's sandbox unless the test turned it off) and collect its output, optionally
stopping it early: `runs.processes.run_process` itself.

The timeout is a hang deadline (tests/waiting.py scales it): a run that reaches it is
reported as `timed_out`, and no test asserts how long a run took (tests/bench/ measures)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from runs.processes import Limits, ProcessWatch, run_process
from runs.providers import Invocation
from runs.sandbox import sandbox_on, step_sandbox
from tests.waiting import hang_deadline


@dataclass
class Finished:
    exit_code: int | None
    stdout: str
    stderr: str
    stopped: bool  # by `stop_when` or the timeout; `exit_code` is None then
    timed_out: bool  # the hang deadline was reached
    ended_at: float  # time.time() once the process had ended (to order against others' clocks)


class _Stopping(ProcessWatch):
    """Stops the agent when `stop_when(stdout, stderr)` says so (None: never)."""

    def __init__(self, stop_when: Callable[[str, str], bool] | None) -> None:
        self.stop = stop_when

    def stop_when(self, stdout: str, stderr: str) -> str | None:
        if self.stop is not None and self.stop(stdout, stderr):
            return "stopped"
        return None


def run_agent(
    invocation: Invocation,
    *,
    timeout: float = 180,
    stop_when: Callable[[str, str], bool] | None = None,
) -> Finished:
    """Run to the end (or `timeout` s, scaled), or until `stop_when(stdout, stderr)` says so."""
    if sandbox_on() and invocation.cwd:
        invocation.sandbox = step_sandbox(
            provider=invocation.provider or "",
            binary=invocation.argv[0],
            root=invocation.cwd,
            common_dir=None,
            account_env=invocation.account_env,
        )
    try:
        result = run_process(
            invocation=invocation,
            limits=Limits(
                timeout_seconds=hang_deadline(timeout),
                tail_bytes=1 << 22,
                grace_seconds=0,
                keep_alive_every=3600,
            ),
            watch=_Stopping(stop_when),
        )
    finally:
        invocation.remove_files()
    ended_at = time.time()
    stopped = result.stopped is not None or result.timeout is not None
    return Finished(
        exit_code=None if stopped else result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        stopped=stopped,
        timed_out=result.timeout is not None,
        ended_at=ended_at,
    )
