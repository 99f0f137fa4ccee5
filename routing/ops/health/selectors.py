"""Two questions, answered apart so a load balancer never takes a web machine out for a late
background worker:

- `web_health`, behind `GET /healthz` (and `/readyz`): can THIS web process serve? Its
  database answers. Nothing about the clusters: a web machine whose clusters are down still
  serves the admin and `/ops/`, which say what is wrong.
- `health_report`, behind `GET /health/installation` and `manage.py health`: is the whole
  installation working? For monitoring, not for a load balancer's rotation.

For the installation three things must hold, each read from the database every process
shares (so any web process on any machine gives the same answer):

- the database answers (`SELECT 1`);
- the main cluster (`qcluster`: schedules, drains, lease recovery) finished a
  `recover-expired-runs` task within MAIN_CLUSTER_WITHIN. That schedule fires every minute
  from the main cluster's scheduler (about every 30 s), its task runs on the main cluster's
  workers and its result row (django-q2 `Task`, `cluster` = the main cluster's name) is
  written by that cluster's monitor: one row proves scheduler, broker, workers and monitor
  all work. (django-q2's own heartbeat, `Stat`, lives in the cache, which is per process
  here, so another process cannot read it.)
- a run cluster (`Q_CLUSTER_NAME=loopsweb-runs qcluster`) has a live worker: each of its
  workers writes its `RunWorker` row every HEARTBEAT_SECONDS (ledger.services.run_workers) and
  a row
  not seen for LIVE_WITHIN is a worker that is gone.

Nothing else is reported: no host names, no pids, no error texts (a database error is
logged, not returned), so the answer may be given without authentication.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Count, Max, Q
from django.utils import timezone
from django_q.models import Task

from ledger.capacity import LIVE_WITHIN
from ledger.models import RunWorker
from runs.sandbox import sandbox_mode, sandbox_problem

logger = logging.getLogger(__name__)

# The built-in minute schedule whose results show the main cluster at work
# (routing.drains.schedules).
MAIN_CLUSTER_PROBE = "recover-expired-runs"
# Its period (60 s) + the scheduler's cycle (30 s) + time to run and store it, with margin.
MAIN_CLUSTER_WITHIN = timedelta(minutes=3)
RUN_CLUSTER_WITHIN = LIVE_WITHIN

OK = "ok"
NOT_REPORTING = "not reporting"
UNKNOWN = "unknown"
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class ClusterHealth:
    name: str
    status: str  # OK, NOT_REPORTING or UNKNOWN (the database did not answer)
    within: timedelta  # how recent its last report must be
    last_seen: datetime | None
    workers: int | None = None  # live workers (run cluster only)

    def as_json(self, now: datetime) -> dict[str, Any]:
        body: dict[str, Any] = {
            "status": self.status,
            "interval_seconds": int(self.within.total_seconds()),
            "last_seen_seconds_ago": None
            if self.last_seen is None
            else max(0, int((now - self.last_seen).total_seconds())),
        }
        if self.workers is not None:
            body["workers"] = self.workers
        return body


@dataclass(frozen=True)
class HealthReport:
    now: datetime
    database: str  # OK or UNAVAILABLE
    clusters: tuple[ClusterHealth, ...]
    # Why agents cannot run sandboxed on this host (runs.sandbox), if they cannot.
    sandbox_problem: str | None = None
    sandbox: str = "bwrap"  # LOOPSWEB_AGENT_SANDBOX

    @property
    def healthy(self) -> bool:
        return (
            self.database == OK
            and all(c.status == OK for c in self.clusters)
            and self.sandbox_problem is None
        )

    @property
    def problems(self) -> list[str]:
        found = []
        if self.database != OK:
            found.append("the database does not answer")
        if self.sandbox_problem is not None:
            found.append(self.sandbox_problem)
        for cluster in self.clusters:
            if cluster.status == NOT_REPORTING:
                seconds = int(cluster.within.total_seconds())
                if cluster.last_seen is None:
                    found.append(f"cluster {cluster.name} has never reported")
                else:
                    found.append(
                        f"cluster {cluster.name} has not reported within {seconds} s"
                    )
        return found

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "status": "ok" if self.healthy else "unhealthy",
            "database": self.database,
            "clusters": {c.name: c.as_json(self.now) for c in self.clusters},
            "agentSandbox": "unavailable" if self.sandbox_problem else self.sandbox,
        }
        if not self.healthy:
            body["problems"] = self.problems
        return body


@dataclass(frozen=True)
class WebHealth:
    database: str  # OK or UNAVAILABLE

    @property
    def healthy(self) -> bool:
        return self.database == OK

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "status": "ok" if self.healthy else "unhealthy",
            "database": self.database,
        }
        if not self.healthy:
            body["problems"] = ["the database does not answer"]
        return body


def database_answers() -> bool:
    """One `SELECT 1`; an error is logged, never returned (it may name hosts)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        logger.error("health: the database does not answer: %s", exc)
        return False
    return True


def web_health() -> WebHealth:
    """This web process's health: one query, whatever the clusters do."""
    return WebHealth(database=OK if database_answers() else UNAVAILABLE)


def main_cluster_name() -> str:
    return str(settings.Q_CLUSTER["name"])


def health_report(*, now: datetime | None = None) -> HealthReport:
    """The installation's health; three queries (one when the database does not answer)."""
    now = now or timezone.now()
    main, runs = main_cluster_name(), settings.LOOPSWEB_RUN_CLUSTER
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        # django-q2's partial index on (group, name, func) for successful tasks serves this.
        main_seen = Task.objects.filter(
            group=MAIN_CLUSTER_PROBE, success=True, cluster=main
        ).aggregate(last=Max("stopped"))["last"]
        workers = RunWorker.objects.filter(cluster=runs).aggregate(
            last=Max("seen_at"),
            live=Count("id", filter=Q(seen_at__gte=now - RUN_CLUSTER_WITHIN)),
        )
    except DatabaseError as exc:
        logger.error("health: the database does not answer: %s", exc)
        return HealthReport(
            now=now,
            database=UNAVAILABLE,
            clusters=(
                ClusterHealth(main, UNKNOWN, MAIN_CLUSTER_WITHIN, None),
                ClusterHealth(runs, UNKNOWN, RUN_CLUSTER_WITHIN, None),
            ),
        )
    main_ok = main_seen is not None and main_seen >= now - MAIN_CLUSTER_WITHIN
    live = int(workers["live"] or 0)
    return HealthReport(
        now=now,
        database=OK,
        sandbox_problem=sandbox_problem(),
        sandbox=sandbox_mode(),
        clusters=(
            ClusterHealth(
                main, OK if main_ok else NOT_REPORTING, MAIN_CLUSTER_WITHIN, main_seen
            ),
            ClusterHealth(
                runs,
                OK if live else NOT_REPORTING,
                RUN_CLUSTER_WITHIN,
                workers["last"],
                workers=live,
            ),
        ),
    )
