"""Hosts and workers known by what cannot repeat: the run cluster instance.

- A host name (LOOPSWEB_HOST_NAME) and a pid repeat: two machines may be given one name, and
  a cluster restarted in a fresh PID namespace (a container) gets the pids its killed
  predecessor had. So every start of a run cluster gets an instance id (random, never
  repeated), recorded with what tells its processes apart: the machine id
  (/etc/machine-id, with the node name: containers of one image share the file), the boot
  id (/proc/sys/kernel/random/boot_id), the PID namespace and its qcluster's pid with that
  pid's start time (`ClusterInstance`).
- A worker is `WorkerId` `<host>:<pid>@<instance>` (`claimed_by`); a process outside a run
  cluster (`manage.py run_workflow`, the web) has an instance of its own, made once per
  process.
- Whether another instance of this host still runs (`instance_fate`): another boot of the
  same machine, or the same PID namespace with its qcluster's pid gone (or reused: another
  start time), is dead; the same machine and boot seen from another PID namespace is the
  machine's previous container (the namespace of a restarted container is gone), so dead
  too; another machine is not this machine's to judge (its heartbeat says).

Record layer: models and settings only (runs.cluster_start acts on what this finds).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings

from ledger.models import ClusterInstance

# The instance of the run cluster this process belongs to: set by the qcluster's main
# process at start (runs.cluster_start), inherited by its sentinel and workers.
INSTANCE_ENV = "LOOPSWEB_CLUSTER_INSTANCE"
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")

_own_instance: str | None = None


def new_instance() -> str:
    return secrets.token_hex(8)


def process_instance() -> str:
    """This process's instance: its run cluster's, else one of its own (made once)."""
    global _own_instance
    inherited = os.environ.get(INSTANCE_ENV, "")
    if inherited:
        return inherited
    if _own_instance is None:
        _own_instance = new_instance()
    return _own_instance


@dataclass(frozen=True)
class WorkerId:
    """Who holds a run: `<host>:<pid>@<instance>` (`<host>:<pid>`: an older loopsweb)."""

    host: str
    pid: int
    instance: str = ""

    def __str__(self) -> str:
        base = f"{self.host}:{self.pid}"
        return f"{base}@{self.instance}" if self.instance else base

    @classmethod
    def parse(cls, text: str | None) -> WorkerId | None:
        """The identity `text` names; None when it is no worker identity at all."""
        if not text:
            return None
        head, at, instance = text.rpartition("@")
        if not at or ":" in instance or not instance:
            head, instance = text, ""
        host, colon, pid = head.rpartition(":")
        if not colon or not host or not pid.isdigit():
            return None
        return cls(host=host, pid=int(pid), instance=instance)

    @classmethod
    def here(cls) -> WorkerId:
        """This process as a worker."""
        return cls(
            host=str(settings.LOOPSWEB_HOST_NAME),
            pid=os.getpid(),
            instance=process_instance(),
        )

    @staticmethod
    def of_instance_suffix(instance: str) -> str:
        """The end every identity of `instance` has (to find the runs it holds)."""
        return f"@{instance}"


# --- what tells machines, boots and process spaces apart -------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def machine_id() -> str:
    """This machine: its machine id (or "-" when it has none) and its node name."""
    found = next((value for f in MACHINE_ID_FILES if (value := _read(f))), "-")
    return f"{found}/{socket.gethostname()}"


def boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot, /proc/<pid>/stat field 22); None when
    no such process runs here (a zombie counts as gone)."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat[stat.rfind(")") + 2 :].split() if stat else []
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


# --- instances ---------------------------------------------------------------------------------

ALIVE, DEAD, ELSEWHERE = "alive", "dead", "elsewhere"


def same_process_space(row: ClusterInstance) -> bool:
    """Whether `row`'s processes are this process's to see: same machine, boot and PID
    namespace."""
    return (
        row.machine_id == machine_id()
        and row.boot_id == boot_id()
        and row.pid_namespace == pid_namespace()
    )


def instance_fate(row: ClusterInstance) -> str:
    """ALIVE, DEAD (module docstring) or ELSEWHERE (another machine: its heartbeat says)."""
    if row.machine_id != machine_id():
        return ELSEWHERE
    if row.boot_id != boot_id():
        return DEAD  # the machine rebooted since
    if row.pid_namespace != pid_namespace():
        return DEAD  # the previous container of this machine
    started = start_ticks(row.pid)
    if started is None or (row.pid_started is not None and started != row.pid_started):
        return DEAD
    return ALIVE


def instance_register(
    instance: str,
    *,
    host: str,
    roots: Sequence[str],
    now: datetime,
    cluster: bool = True,
) -> ClusterInstance:
    """This process (a qcluster starting) as `instance` of `host`."""
    pid = os.getpid()
    row, _ = ClusterInstance.objects.get_or_create(
        instance=instance,
        defaults={
            "host": host,
            "machine_id": machine_id(),
            "boot_id": boot_id(),
            "pid_namespace": pid_namespace(),
            "pid": pid,
            "pid_started": start_ticks(pid),
            "roots": list(roots),
            "seen_at": now,
            "cluster": cluster,
        },
    )
    return row


_process_registered = False


def process_register(now: datetime) -> None:
    """A process outside any run cluster that claims runs (`manage.py run_workflow`): its
    instance recorded once (`cluster` false), so that a process of its machine, boot and PID
    namespace (`loop stop`, a cancel) may signal its steps. A run cluster's own workers are
    recorded by its start already."""
    global _process_registered
    if _process_registered or os.environ.get(INSTANCE_ENV):
        return
    instance_register(
        process_instance(),
        host=str(settings.LOOPSWEB_HOST_NAME),
        roots=[],
        now=now,
        cluster=False,
    )
    _process_registered = True


def instance_seen(instance: str, now: datetime) -> None:
    ClusterInstance.objects.filter(instance=instance).update(seen_at=now)


def instances_end(instances: list[str], now: datetime) -> None:
    """These run cluster instances are over (a cluster's start found them gone)."""
    ClusterInstance.objects.filter(instance__in=instances).update(ended_at=now)


def process_space_of(instance: str) -> bool:
    """Whether the processes of `instance` are this process's to signal: its own instance,
    or a registered one of this machine, boot and PID namespace."""
    if not instance:
        return False
    if instance == process_instance():
        return True
    row = ClusterInstance.objects.filter(instance=instance).first()
    return row is not None and same_process_space(row)


def host_conflicts(*, now: datetime, live_within: timedelta) -> dict[str, str]:
    """Host names that live run clusters of different machines or roots report at once
    (runs.cluster_start refuses the second; one that slipped past is shown loudly):
    name -> what differs."""
    rows = ClusterInstance.objects.filter(
        cluster=True, ended_at__isnull=True, seen_at__gte=now - live_within
    ).values_list("host", "machine_id", "roots")
    seen: dict[str, set[tuple[str, tuple[str, ...]]]] = {}
    for host, machine, roots in rows:
        seen.setdefault(host, set()).add((machine, tuple(sorted(roots or []))))
    return {
        host: "; ".join(
            f"machine {machine}, roots {', '.join(roots) or 'none'}"
            for machine, roots in sorted(kinds)
        )
        for host, kinds in seen.items()
        if len(kinds) > 1
    }
