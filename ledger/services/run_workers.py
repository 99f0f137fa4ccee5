"""A run worker's report that it is alive: its `RunWorker` row, written with every heartbeat
(runs.heartbeat, every HEARTBEAT_SECONDS: one UPDATE) and read by ledger.capacity; the rows
of workers long gone are forgotten by the host's beat (`run_workers_forget`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from ledger.models import RunWorker

# Rows of workers gone this long are deleted by the next host beat of any host.
FORGET_AFTER = timedelta(days=1)


def run_worker_report(
    *,
    cluster: str,
    host: str,
    pid: int,
    cluster_pid: int,
    instance: str = "",
    now: datetime | None = None,
) -> None:
    """Record that this worker is alive (upsert on host and pid: a pid its host reuses
    takes the old row over, with its instance). One UPDATE once the row exists: a worker
    is the only writer of its own row."""
    now = now or timezone.now()
    fields = {"cluster": cluster, "cluster_pid": cluster_pid, "instance": instance}
    updated = RunWorker.objects.filter(host=host, pid=pid).update(
        seen_at=now, updated_at=now, **fields
    )
    if not updated:
        RunWorker.objects.create(host=host, pid=pid, seen_at=now, **fields)


def run_workers_forget(now: datetime | None = None) -> int:
    """Delete the rows of workers gone for FORGET_AFTER; how many."""
    now = now or timezone.now()
    deleted, _ = RunWorker.objects.filter(seen_at__lt=now - FORGET_AFTER).delete()
    return deleted
