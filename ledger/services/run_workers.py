"""A run worker's report that it is alive: its `RunWorker` row, written with every heartbeat
(runs.heartbeat, every HEARTBEAT_SECONDS) and read by ledger.capacity."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from ledger.models import RunWorker

# Rows of workers gone this long are deleted by the next heartbeat of any worker.
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
    takes the old row over, with its instance); forget long-gone workers."""
    now = now or timezone.now()
    fields = {"cluster": cluster, "cluster_pid": cluster_pid, "instance": instance}
    with transaction.atomic():
        updated = RunWorker.objects.filter(host=host, pid=pid).update(
            seen_at=now, updated_at=now, **fields
        )
        if not updated:
            RunWorker.objects.create(host=host, pid=pid, seen_at=now, **fields)
        RunWorker.objects.filter(seen_at__lt=now - FORGET_AFTER).delete()
