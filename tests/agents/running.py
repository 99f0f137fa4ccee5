"""Start an agent the way the runner does (the adapter's argv, env and cwd; no shell; its own
process group) and collect its output, optionally stopping it early.

The timeout is a hang deadline (tests/waiting.py scales it): a run that reaches it is
reported as `timed_out`, and no test asserts how long a run took (tests/bench/ measures)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ledger.providers import Invocation
from tests.waiting import hang_deadline


@dataclass
class Finished:
    exit_code: int | None
    stdout: str
    stderr: str
    stopped: bool  # by `stop_when` or the timeout; `exit_code` is None then
    timed_out: bool  # the hang deadline was reached
    ended_at: float  # time.time() once the process had ended (to order against others' clocks)


def run_agent(
    invocation: Invocation,
    *,
    timeout: float = 180,
    stop_when: Callable[[str, str], bool] | None = None,
) -> Finished:
    """Run to the end (or `timeout` s, scaled), or until `stop_when(stdout, stderr)` says so."""
    deadline = time.monotonic() + hang_deadline(timeout)
    proc = subprocess.Popen(
        invocation.argv,
        cwd=invocation.cwd,
        # codex puts its sandbox helper beside CODEX_HOME, but not under the temporary dir,
        # where the suite's homes lie; without it, a system bwrap cannot start its commands
        # (the runner's sandbox sets the same, ledger.sandbox).
        env={**invocation.env, "TMPDIR": "/var/tmp"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    out: list[str] = []
    err: list[str] = []
    changed = threading.Event()

    def pump(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)
            changed.set()

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err), daemon=True),
    ]
    for thread in threads:
        thread.start()
    stopped = timed_out = False
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                stopped = timed_out = True
                break
            changed.wait(0.2)
            changed.clear()
            if stop_when is not None and stop_when("".join(out), "".join(err)):
                stopped = True
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        ended_at = time.time()
        for thread in threads:
            thread.join(5)
        invocation.remove_files()
    return Finished(
        exit_code=None if stopped else proc.returncode,
        stdout="".join(out),
        stderr="".join(err),
        stopped=stopped,
        timed_out=timed_out,
        ended_at=ended_at,
    )
