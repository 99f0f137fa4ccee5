"""The reaper: the process groups a step left behind on this host when the ledger ended it
(a cancel, a lease recovery, a lost host), ended after the commit that ended the step, so
nothing a run started outlives its record.

A group is found by pid and start time, so a reused pid is never signalled, and only where
the claiming cluster instance's processes are (ledger.instances), never by host name. The
services call `kill_leftovers`; the processes themselves are started by runs.processes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings

from ledger.instances import WorkerId, process_space_of
from ledger.models import WorkflowStepRun


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


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies, ended but not yet reaped by
    their parent, do not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, group = stat[stat.rfind(")") + 2 :].split()[:3]
        if int(group) == pgid and state != "Z":
            return True
    return False


def kill_step_process_group(
    step: WorkflowStepRun, *, claimed_by: str | None, grace_seconds: float = 1.0
) -> bool:
    """Kill a step's process group if it still lives on this host. True when signalled.

    Only the run cluster instance that started it, or a process that sees its processes
    (the same machine, boot and PID namespace: ledger.instances), signals it; never a
    process that only shares its host name (pids repeat across machines and containers).
    The pid is trusted only when it still leads its own group (the runner starts every step
    in a new session) and started no earlier than the step did, so a reused pid is never
    killed.
    """
    pid = step.pid
    if not pid or not claimed_by or not step.started_at:
        return False
    worker = WorkerId.parse(claimed_by)
    if worker is None or not process_space_of(worker.instance):
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
    if not _group_alive(pid):
        return False  # ended already (its guard saw the runner die), not yet reaped
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
