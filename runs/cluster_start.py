"""A run cluster's start: its instance, a refusal when its host name is taken, and what a
killed predecessor left.

Runs in the qcluster's main process (`manage.py qcluster` of the run cluster), before its
sentinel forks the workers (runs/management/commands/qcluster.py: django-q2's command,
started through here; nothing else of it changes):

1. A new instance id (ledger.instances), in the environment its sentinel and workers inherit.
2. Refused, with one line and exit status 1, while another live run cluster (seen within
   LOOPSWEB_HOST_DEAD_SECONDS, not known dead) reports this host name from another machine
   or with other project roots: both would write one host row, and admission, placement
   and `loop stop` would trust whichever wrote last.
3. Registered (`ClusterInstance`); then each earlier instance of this host that is known
   dead (ledger.instances: `instance_fate`; or silent for LOOPSWEB_HOST_DEAD_SECONDS) is
   ended: the runs its workers held fail at once (ledger.services.hostloss), what their
   agents left uncommitted in their worktrees is committed on their branches
   (runs.run_worktree.save_work_of_ended), and when no other instance of this host runs,
   the tasks this host's queue had handed out are queued again
   (ledger.queue.host_queue_release_fetched), whatever pid the new cluster has.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import DatabaseError, connections
from django.utils import timezone

from ledger.dberrors import error_passes, first_line
from ledger.hosts import dead_after, host_name, local_roots
from ledger.instances import (
    DEAD,
    ELSEWHERE,
    INSTANCE_ENV,
    instance_fate,
    instance_register,
    instances_end,
    machine_id,
    new_instance,
)
from ledger.models import ClusterInstance
from ledger.queue import host_queue_release_fetched
from ledger.services import runs_end_of_instances
from runs.run_worktree import save_work_of_ended

logger = logging.getLogger(__name__)

DATABASE_AWAY = "run cluster not started: the database is away ({error})"
REFUSED = (
    "run cluster refused: host name {host} is taken by a live run cluster {why} (seen "
    "{seen} s ago); give this machine its own LOOPSWEB_HOST_NAME, or stop that cluster"
)


def start_refusal(
    host: str, roots: Sequence[str], now: datetime, *, exclude: str = ""
) -> str | None:
    """Why a run cluster of `host` with `roots` may not start here now (None: it may)."""
    live = ClusterInstance.objects.filter(
        host=host, cluster=True, ended_at__isnull=True, seen_at__gte=now - dead_after()
    ).exclude(instance=exclude)
    for row in live.order_by("-seen_at"):
        if instance_fate(row) == DEAD:
            continue
        if row.machine_id != machine_id():
            why = f"on another machine ({row.machine_id})"
        elif sorted(row.roots or []) != sorted(roots):
            why = f"with other project roots ({', '.join(row.roots or []) or 'none'})"
        else:
            continue
        seen = int((now - row.seen_at).total_seconds())
        return REFUSED.format(host=host, why=why, seen=seen)
    return None


def _start_refusal_or_away(
    host: str, roots: Sequence[str], now: datetime
) -> str | None:
    try:
        return start_refusal(host, roots, now)
    except DatabaseError as exc:
        if not error_passes(exc):
            raise
        return DATABASE_AWAY.format(error=first_line(exc))


def predecessors_end(host: str, instance: str, now: datetime) -> tuple[list[str], bool]:
    """End the earlier instances of `host` known dead; (their ids, whether any other
    instance of this host may still run)."""
    others = list(
        ClusterInstance.objects.filter(
            host=host, cluster=True, ended_at__isnull=True
        ).exclude(instance=instance)
    )
    gone, running = [], False
    for row in others:
        fate = instance_fate(row)
        if fate == DEAD or (fate == ELSEWHERE and row.seen_at < now - dead_after()):
            gone.append(row.instance)
        else:
            running = True
    instances_end(gone, now)
    return gone, running


def cluster_start(now: datetime | None = None) -> str:
    """The start the module docstring lists, "a new instance id" to "registered"; this
    cluster's instance id. CommandError: refused."""
    now = now or timezone.now()
    host, roots = host_name(), local_roots()
    instance = new_instance()
    os.environ[INSTANCE_ENV] = instance
    try:
        refusal = _start_refusal_or_away(host, roots, now)
        if refusal is not None:
            raise CommandError(refusal)
        instance_register(instance, host=host, roots=roots, now=now)
        gone, running = predecessors_end(host, instance, now)
        failed = runs_end_of_instances(gone, now=now)
        # What their agents left uncommitted in worktrees here, on their runs' branches.
        save_work_of_ended(failed)
        released = [] if running else host_queue_release_fetched(now)
        if gone or failed or released:
            logger.warning(
                "run cluster %s of host %s: %d earlier cluster(s) gone, %d of their "
                "runs failed, %d fetched runs queued again",
                instance,
                host,
                len(gone),
                len(failed),
                len(released),
            )
    finally:
        # The sentinel forks next: no connection crosses the fork (one inside a
        # transaction is a caller's, a test's).
        for connection in connections.all(initialized_only=True):
            if not connection.in_atomic_block:
                connection.close()
    return instance


def is_run_cluster(options: dict[str, Any]) -> bool:
    name = options.get("cluster_name") or os.environ.get("Q_CLUSTER_NAME", "")
    return name == settings.LOOPSWEB_RUN_CLUSTER
