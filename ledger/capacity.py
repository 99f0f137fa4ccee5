"""Run capacity: which run workers exist (busy / total per cluster) and which runs wait too long.

- Every worker process of a run cluster reports itself every HEARTBEAT_SECONDS from a small
  thread started when django-q2 spawns it (runs.heartbeat, writing with
  ledger.services.run_workers); this module only reads those rows: a row not
  seen for LIVE_WITHIN is a worker that is gone (stopped, killed, its machine down).
- Busy workers are the live ones holding a running run (`claimed_by`: ledger.instances
  `WorkerId`, `<host>:<pid>@<instance>`), read
  from the runs themselves: nothing else to keep in step.
- Waiting too long: queued runs (and parked runs past their due time) older than
  WAITING_TOO_LONG, the horizon after which a run whose task is lost has been handed out again.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

from django.db.models import Count, Min, Q
from django_q.models import OrmQ

from ledger.hosts import dead_after
from ledger.instances import (
    WorkerId,
    host_conflicts,
)
from ledger.models import Host, RunStatus, RunWorker, WorkflowRun

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0
LIVE_WITHIN = timedelta(seconds=35)
WAITING_TOO_LONG = timedelta(minutes=2)


@dataclass(frozen=True)
class ClusterCapacity:
    cluster: str
    host: str
    cluster_pid: int
    workers: int
    busy: int
    seen_at: datetime


@dataclass(frozen=True)
class RunCapacity:
    clusters: list[ClusterCapacity]
    waiting: int  # runs waiting longer than WAITING_TOO_LONG
    oldest_waiting: datetime | None

    @property
    def workers(self) -> int:
        return sum(c.workers for c in self.clusters)

    @property
    def busy(self) -> int:
        return sum(c.busy for c in self.clusters)


def run_capacity(*, now: datetime) -> RunCapacity:
    """Live run workers per cluster with how many hold a run, and the runs waiting too long.

    Three queries whatever the history: live workers, running runs per worker, waiting runs.
    """
    workers = list(
        RunWorker.objects.filter(seen_at__gte=now - LIVE_WITHIN).order_by(
            "cluster", "host", "cluster_pid", "pid"
        )
    )
    holding = dict(
        WorkflowRun.objects.filter(status=RunStatus.RUNNING, claimed_by__isnull=False)
        .values("claimed_by")
        .annotate(n=Count("id"))
        .values_list("claimed_by", "n")
    )
    totals: Counter[tuple[str, str, int]] = Counter()
    busy: Counter[tuple[str, str, int]] = Counter()
    seen: dict[tuple[str, str, int], datetime] = {}
    for worker in workers:
        key = (worker.cluster, worker.host, worker.cluster_pid)
        totals[key] += 1
        if holding.get(str(WorkerId(worker.host, worker.pid, worker.instance))):
            busy[key] += 1
        seen[key] = max(seen.get(key, worker.seen_at), worker.seen_at)
    cutoff = now - WAITING_TOO_LONG
    waiting = WorkflowRun.objects.filter(
        Q(status=RunStatus.QUEUED, created_at__lt=cutoff)
        | Q(
            status=RunStatus.RUNNING,
            claimed_by__isnull=True,
            lease_expires_at__lt=cutoff,
        )
    ).aggregate(n=Count("id"), oldest=Min("created_at"))
    return RunCapacity(
        clusters=[
            ClusterCapacity(
                cluster=key[0],
                host=key[1],
                cluster_pid=key[2],
                workers=totals[key],
                busy=busy[key],
                seen_at=seen[key],
            )
            for key in totals
        ],
        waiting=int(waiting["n"] or 0),
        oldest_waiting=waiting["oldest"],
    )


@dataclass(frozen=True)
class HostRow:
    name: str
    seen_at: datetime
    live: bool
    released_at: datetime | None
    roots: list[str]
    providers: list[str]
    workers: int  # live run workers reporting from this host
    busy: int  # of them, holding a running run
    running: int  # runs running on this host now
    queued: int  # tasks in its queue (running and waiting)
    machine_id: str = ""
    conflict: str | None = (
        None  # live clusters of other machines or roots report this name
    )


@dataclass(frozen=True)
class WaitingForHost:
    run_id: str
    workflow_name: str
    reason: str
    since: datetime


@dataclass(frozen=True)
class LostRun:
    run_id: str
    workflow_name: str
    host: str
    ended_at: datetime | None
    branch: str | None  # the run's branch (its commit, if it made one, is on it there)
    commit_head: str | None


@dataclass(frozen=True)
class HostsView:
    hosts: list[HostRow]
    waiting: list[WaitingForHost]  # runs no live host serves (oldest first, at most 50)
    waiting_total: int
    lost: list[LostRun] = field(default_factory=list)  # newest first, at most 50

    @property
    def conflicts(self) -> list[HostRow]:
        return [h for h in self.hosts if h.conflict]


def lost_runs(limit: int = 50) -> list[LostRun]:
    """The runs that ended because their host was gone (ledger.services.hostloss)."""
    rows = WorkflowRun.objects.filter(lost_with_host__isnull=False).order_by(
        "-finished_at"
    )
    return [
        LostRun(
            run_id=r["id"],
            workflow_name=r["workflow_name"],
            host=str(r["lost_with_host"]),  # not NULL: the filter above
            ended_at=r["finished_at"],
            branch=r["worktree_branch"],
            commit_head=r["commit_head"],
        )
        for r in rows.values(
            "id",
            "workflow_name",
            "lost_with_host",
            "finished_at",
            "worktree_branch",
            "commit_head",
        )[:limit]
    ]


def hosts_view(*, now: datetime) -> HostsView:
    """Every registered host with its heartbeat, workers, roots, providers and runs now,
    the runs no live host serves (ledger.hosts), host names reported by clusters of different
    machines or roots, and the runs lost with their host. Eight queries whatever the history."""
    hosts = list(Host.objects.order_by("name"))
    workers: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    holding = set(
        WorkflowRun.objects.filter(
            status=RunStatus.RUNNING, claimed_by__isnull=False
        ).values_list("claimed_by", flat=True)
    )
    for host, pid, instance in RunWorker.objects.filter(
        seen_at__gte=now - LIVE_WITHIN
    ).values_list("host", "pid", "instance"):
        workers[host] += 1
        if str(WorkerId(host, pid, instance)) in holding:
            busy[host] += 1
    running = dict(
        WorkflowRun.objects.filter(status=RunStatus.RUNNING, host__isnull=False)
        .values("host")
        .annotate(n=Count("id"))
        .values_list("host", "n")
    )
    queued = dict(
        OrmQ.objects.filter(key__in=[h.queue for h in hosts])
        .values("key")
        .annotate(n=Count("id"))
        .values_list("key", "n")
    )
    conflicts = host_conflicts(now=now, live_within=dead_after())
    waiting_rows = WorkflowRun.objects.filter(
        status=RunStatus.QUEUED, host_wait_since__isnull=False
    )
    waiting = [
        WaitingForHost(
            run_id=r["id"],
            workflow_name=r["workflow_name"],
            reason=r["host_wait_reason"] or "",
            since=cast(datetime, r["host_wait_since"]),  # not NULL: the filter above
        )
        for r in waiting_rows.order_by("host_wait_since").values(
            "id", "workflow_name", "host_wait_reason", "host_wait_since"
        )[:50]
    ]
    return HostsView(
        hosts=[
            HostRow(
                name=h.name,
                seen_at=h.seen_at,
                live=h.seen_at >= now - dead_after(),
                released_at=h.released_at,
                roots=list(h.roots or []),
                providers=list(h.providers or []),
                workers=workers[h.name],
                busy=busy[h.name],
                running=int(running.get(h.name, 0)),
                queued=int(queued.get(h.queue, 0)),
                machine_id=h.machine_id,
                conflict=conflicts.get(h.name),
            )
            for h in hosts
        ],
        waiting=waiting,
        waiting_total=len(waiting) if len(waiting) < 50 else waiting_rows.count(),
        lost=lost_runs(),
    )
