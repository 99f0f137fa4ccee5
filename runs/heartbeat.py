"""The heartbeat of a run cluster's worker (django-q2 `post_spawn`, connected in runs.apps):
a small thread in each worker that, every HEARTBEAT_SECONDS, says the worker and its cluster
instance live (ledger.services.run_workers, ledger.instances: two one-row UPDATEs).

The host-level work is done once per host, not once per worker: by the worker that holds
the host's duty (`HostDuty`: an exclusive lock on a file of the host's in the data
directory, which the kernel releases when that worker dies, so another takes it at its next
beat). It writes the host's row (ledger.hosts), forgets run workers long gone, moves a dead
host's queue to the live ones and ends the runs that were on it (ledger.services.hostloss),
and checks which projects this host has.

What a killed predecessor of the cluster left was taken over at its start
(runs.cluster_start). A passing database error is one line per outage.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from ledger.capacity import HEARTBEAT_SECONDS
from ledger.dberrors import OutageNotice
from ledger.hosts import host_report, local_providers
from ledger.instances import instance_seen, process_instance
from ledger.queue import host_projects_refresh, hosts_release_dead
from ledger.services import runs_end_on_gone_hosts
from ledger.services.run_workers import run_worker_report, run_workers_forget

logger = logging.getLogger(__name__)
# Beats in a row (HEARTBEAT_SECONDS apart) the database must have taken before this worker
# ends the runs of hosts it sees dead: every live host has reported again by then.
STEADY_BEATS = 2


class HostDuty:
    """Whether this worker does its host's beat: it holds an exclusive, non-blocking
    `flock` on `<data dir>/heartbeat-<host>.lock` (kept open for the worker's life). A
    file that cannot be opened or locked for another reason than being held leaves every
    worker on duty, as before this lock."""

    def __init__(self, host: str) -> None:
        name = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "host"
        self.path = Path(settings.DATA_DIR) / f"heartbeat-{name}.lock"
        self.fd: int | None = None

    def held(self) -> bool:
        if self.fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # another worker of this host is on duty
        except OSError:
            os.close(fd)
            return True
        self.fd = fd
        return True


def heartbeat(cluster: str, stop: threading.Event) -> None:
    host, pid, parent = settings.LOOPSWEB_HOST_NAME, os.getpid(), os.getppid()
    # The providers this machine has: looked up once (PATH does not change under a worker).
    providers = local_providers()
    instance = process_instance()
    notice = OutageNotice(f"run worker {host}:{pid} could not report itself")
    steady = 0  # beats in a row the database took
    duty = HostDuty(host)
    while True:
        try:
            close_old_connections()
            # What a killed predecessor of this cluster left was taken over at its start
            # (runs.cluster_start); each beat says this worker and its instance live.
            now = timezone.now()
            run_worker_report(
                cluster=cluster,
                host=host,
                pid=pid,
                cluster_pid=parent,
                instance=instance,
                now=now,
            )
            instance_seen(instance, now)
            if duty.held():
                _host_beat(providers, steady=steady, now=now)
            notice.ok()
            steady += 1
        except DatabaseError as exc:
            notice.failed(exc)  # one line per outage
            steady = 0
        except Exception:  # a bug must not end the heartbeat: the host would look dead
            logger.exception("run worker %s:%s heartbeat failed", host, pid)
        finally:
            # This thread's own connection: kept between beats only with persistent
            # connections (DATABASE_CONN_MAX_AGE), checked again before the next beat.
            close_old_connections()
        if stop.wait(HEARTBEAT_SECONDS):
            return


def _host_beat(providers: list[str], *, steady: int, now: datetime) -> None:
    """The host-level work of one beat, done by the worker on duty (module docstring)."""
    # The host's own row (ledger.hosts), then any dead host's queue moved to the live
    # ones: a dead host's waiting runs are placed again within one beat.
    host_report(workers=int(settings.LOOPSWEB_RUN_WORKERS), providers=providers)
    run_workers_forget(now)
    hosts_release_dead()
    # ... and the runs that were on a dead host end (ledger.services.hostloss), once this
    # worker has had the database for STEADY_BEATS beats: after an outage longer than the
    # dead-host time every host looks dead until it has reported again, and a live host's
    # runs must not end for that.
    if steady >= STEADY_BEATS:
        runs_end_on_gone_hosts()
    # Which projects this host has (placement knows the checkout, ledger.hosts).
    host_projects_refresh()


def on_worker_spawn(sender: Any, proc_name: str = "", **kwargs: Any) -> None:
    """django-q2 `post_spawn` receiver: a run-cluster worker starts reporting itself."""
    from django_q.conf import Conf

    if Conf.CLUSTER_NAME != settings.LOOPSWEB_RUN_CLUSTER:
        return
    threading.Thread(
        target=heartbeat,
        args=(Conf.CLUSTER_NAME, threading.Event()),
        name="loopsweb-run-worker-heartbeat",
        daemon=True,
    ).start()
