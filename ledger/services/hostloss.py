"""Runs that outlive what they ran on: a host that is gone, a run cluster instance that is gone.

- `runs_end_on_gone_hosts` (a live host's heartbeat, runs.heartbeat, once it has had
  the database for a while) and `runs_end_on_host` (`hosts --forget`): a host declared dead
  (not seen for LOOPSWEB_HOST_DEAD_SECONDS) or forgotten takes its runs with it: every
  `running` run whose worktree is on it (parked between steps, holding no worker, or running) or that a worker
  of it holds ends `failed` with HOST_GONE_ERROR, and `lost_with_host` names the host
  (/ops/hosts/ lists the work lost with a host). Ending it frees its caps and account loads
  (the cascade); its item is retried by its loop within `--max-attempts`, as a new run that
  any live host serving it takes, in a fresh worktree.
- `runs_end_of_instances`: a run cluster that restarted (runs.cluster_start) fails at
  once what its dead predecessor's workers held (their processes died with it), rather
  than after the lease.

Per run, its own short transaction under the admission lock, re-checked under the run lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime

from django.db import transaction
from django.db.models import Q

from ledger.hosts import dead_after
from ledger.instances import WorkerId
from ledger.lock import admission_lock
from ledger.models import Host, RunStatus, StepStatus, WorkflowRun
from ledger.reaper import kill_leftovers
from ledger.services.cascade import end_run, finish_open_steps
from ledger.services.common import lock_run, now_or_default
from ledger.services.notifications import notify_host_gone

logger = logging.getLogger(__name__)

HOST_GONE_ERROR = (
    "host {host} is gone; its worktree (and any uncommitted work) stayed there"
)
INSTANCE_GONE_ERROR = (
    "its run cluster on host {host} was restarted: worker {worker} is gone"
)
# Runs ended per call (the rest at the next heartbeat).
BATCH = 200


def _on_host(host: str) -> Q:
    return Q(worktree_host=host, worktree_removed_at__isnull=True) | Q(
        host=host, claimed_by__isnull=False
    )


def _end_lost(
    run_id: str,
    *,
    still: Callable[[WorkflowRun], bool],
    error: str,
    payload: dict[str, object],
    now: datetime,
    lost_with_host: str | None = None,
) -> bool:
    with transaction.atomic():
        admission_lock()
        run = lock_run(run_id)
        if run.status != RunStatus.RUNNING or not still(run):
            return False
        claimed_by = run.claimed_by
        was_running = finish_open_steps(
            run,
            pending_to=StepStatus.SKIPPED,
            running_to=StepStatus.FAILED,
            error=error,
            now=now,
        )
        if lost_with_host is not None:
            run.lost_with_host = lost_with_host
            run.save(update_fields=["lost_with_host", "updated_at"])
        end_run(
            run,
            status=RunStatus.FAILED,
            error=error,
            item_reason=error,
            now=now,
            event_payload=payload,
        )
    kill_leftovers(was_running, claimed_by)
    logger.warning("ended workflow run %s: %s", run_id, error)
    return True


def runs_end_on_host(host: str, *, now: datetime | None = None) -> list[str]:
    """End every running run on `host` (module docstring); the ids ended."""
    now = now_or_default(now)
    error = HOST_GONE_ERROR.format(host=host)
    ids = WorkflowRun.objects.filter(_on_host(host), status=RunStatus.RUNNING)
    ended = []
    for run_id in ids.order_by("created_at").values_list("id", flat=True)[:BATCH]:

        def still(run: WorkflowRun) -> bool:
            return WorkflowRun.objects.filter(_on_host(host), pk=run.pk).exists()

        if _end_lost(
            run_id,
            still=still,
            error=error,
            payload={"recovery": "host_gone", "host": host},
            now=now,
            lost_with_host=host,
        ):
            ended.append(run_id)
    return ended


def runs_end_on_gone_hosts(*, now: datetime | None = None) -> list[str]:
    """End the running runs of every host not seen for LOOPSWEB_HOST_DEAD_SECONDS."""
    now = now_or_default(now)
    dead = Host.objects.filter(seen_at__lt=now - dead_after()).values_list(
        "name", "seen_at"
    )
    ended: list[str] = []
    for host, seen_at in dead:
        on_host = runs_end_on_host(host, now=now)
        # Told once per silence (docs/operations.md "Notifications"): no write when told.
        notify_host_gone(host=host, seen_at=seen_at, ended=on_host)
        ended += on_host
    return ended


def runs_end_of_instances(
    instances: Collection[str], *, now: datetime | None = None
) -> list[str]:
    """Fail the running runs that workers of the gone `instances` hold."""
    now = now_or_default(now)
    ended: list[str] = []
    for instance in instances:
        suffix = WorkerId.of_instance_suffix(instance)
        held = WorkflowRun.objects.filter(
            status=RunStatus.RUNNING, claimed_by__endswith=suffix
        ).values_list("id", "claimed_by")
        for run_id, worker in list(held[:BATCH]):
            parsed = WorkerId.parse(worker)
            if parsed is None or parsed.instance != instance:
                continue

            holder = str(parsed)

            def still(run: WorkflowRun, holder: str = holder) -> bool:
                return run.claimed_by == holder

            if _end_lost(
                run_id,
                still=still,
                error=INSTANCE_GONE_ERROR.format(host=parsed.host, worker=holder),
                payload={"recovery": "instance_gone", "claimedBy": holder},
                now=now,
            ):
                ended.append(run_id)
    return ended
