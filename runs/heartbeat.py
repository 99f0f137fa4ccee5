"""The heartbeat of a run cluster's worker (django-q2 `post_spawn`, connected in runs.apps):
a small thread in each worker that, every HEARTBEAT_SECONDS, says the worker and its cluster
instance live (ledger.services.run_workers, ledger.instances), writes its host's row
(ledger.hosts),
moves a dead host's queue to the live ones and ends the runs that were on it
(ledger.services.hostloss), and checks which projects this host has.

What a killed predecessor of the cluster left was taken over at its start
(runs.cluster_start). A passing database error is one line per outage.
"""

from __future__ import annotations

import logging
import os
import threading
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
from ledger.services.run_workers import run_worker_report

logger = logging.getLogger(__name__)
# Beats in a row (HEARTBEAT_SECONDS apart) the database must have taken before this worker
# ends the runs of hosts it sees dead: every live host has reported again by then.
STEADY_BEATS = 2


def heartbeat(cluster: str, stop: threading.Event) -> None:
    host, pid, parent = settings.LOOPSWEB_HOST_NAME, os.getpid(), os.getppid()
    # The providers this machine has: looked up once (PATH does not change under a worker).
    providers = local_providers()
    instance = process_instance()
    notice = OutageNotice(f"run worker {host}:{pid} could not report itself")
    steady = 0  # beats in a row the database took
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
            # The host's own row (ledger.hosts), then any dead host's queue moved to the
            # live ones: a dead host's waiting runs are placed again within one beat.
            host_report(workers=int(settings.LOOPSWEB_RUN_WORKERS), providers=providers)
            hosts_release_dead()
            # ... and the runs that were on a dead host end (ledger.services.hostloss),
            # once this worker has had the database for STEADY_BEATS beats: after an
            # outage longer than the dead-host time every host looks dead until it has
            # reported again, and a live host's runs must not end for that.
            if steady >= STEADY_BEATS:
                runs_end_on_gone_hosts()
            # Which projects this host has (placement knows the checkout, ledger.hosts).
            host_projects_refresh()
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
