"""A step stopped because its provider refused it is killed at once (runs/agent_step.py
`STOP_GRACE_SECONDS`, runs/processes.py `stop_grace_seconds`): the CLI is only waiting to
try again, so the step moves to another account without waiting the kill grace
(tests/bench/bench_failover_opencode.py measures the move).

The agent here is a Python script printing opencode's log line for a 429 on stderr; on
SIGTERM it waits 30 s and exits 3, so a stop that waited for it (the grace before) would end
with exit code 3, and one that did not ends by SIGKILL."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from runs.agent_step import STOP_RATE_LIMIT, StepWatch
from runs.processes import Limits, ProcessResult
from runs.providers import Invocation

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

# Its SIGTERM handler outlasts any wait of the runner's but the grace below.
AGENT = """
import signal, sys, time
def term(*_):
    time.sleep(30)
    sys.exit(3)
signal.signal(signal.SIGTERM, term)
print('timestamp=2026-12-07T13:36:41.787Z level=ERROR message="stream error" '
      'error.error="AI_APICallError: Rate limit reached for requests. Please try again '
      'in 30s."', file=sys.stderr, flush=True)
while True:
    time.sleep(1)
"""


def test_a_rate_limited_agent_is_killed_without_the_grace(tmp_path: Path) -> None:
    watch = StepWatch("step-1", "opencode", is_agent=True)
    result: ProcessResult = watch.run(
        invocation=Invocation(
            argv=[sys.executable, "-c", AGENT],
            cwd=str(tmp_path),
            env={"PATH": os.environ["PATH"]},
        ),
        limits=Limits(
            tail_bytes=65536,
            grace_seconds=60,  # what LOOPSWEB_KILL_GRACE_SECONDS would give a timeout
            keep_alive_every=3600,
        ),
    )
    assert result.stopped == STOP_RATE_LIMIT, result
    # Killed, not ended by its own SIGTERM handler after its wait (exit code 3).
    assert (result.signal_name, result.exit_code) == ("SIGKILL", None), result
    assert watch.signal is not None and watch.signal.until is not None  # "in 30s"
