"""Process groups a step left behind: find them by pid and start time, stop them
(SIGTERM, then SIGKILL after LOOPSWEB_KILL_GRACE_SECONDS).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings

from ledger.models import (
    WorkflowStepRun,
)

# --- process groups left behind ---------------------------------------------------------------


def _process_start_time(pid: int) -> datetime | None:
    """When `pid` started (Linux /proc), to tell a step's process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
    seconds = boot + ticks / os.sysconf("SC_CLK_TCK")
    return datetime.fromtimestamp(seconds, tz=UTC)


def kill_step_process_group(
    step: WorkflowStepRun, *, claimed_by: str | None, grace_seconds: float = 1.0
) -> bool:
    """Kill a step's process group if it still lives on this host. True when signalled.

    Only the claiming host can see the process. The pid is trusted only when it still leads
    its own group (the runner starts every step in a new session) and started no earlier
    than the step did, so a reused pid is never killed.
    """
    pid = step.pid
    if not pid or not claimed_by or not step.started_at:
        return False
    if claimed_by.rsplit(":", 1)[0] != socket.gethostname():
        return False
    try:
        if os.getpgid(pid) != pid:
            return False
    except ProcessLookupError:
        return False
    started = _process_start_time(pid)
    # /proc's boot time has one-second resolution: allow two seconds of slack.
    if started is None or started < step.started_at - timedelta(seconds=2):
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def kill_leftovers(
    steps: Iterable[WorkflowStepRun], claimed_by: str | None
) -> list[int]:
    """Kill the process groups `steps` (just ended by the ledger) left alive on this host,
    with LOOPSWEB_KILL_GRACE_SECONDS between SIGTERM and SIGKILL; the pids signalled."""
    grace = float(settings.LOOPSWEB_KILL_GRACE_SECONDS)
    return [
        step.pid
        for step in steps
        if step.pid
        and kill_step_process_group(step, claimed_by=claimed_by, grace_seconds=grace)
    ]
