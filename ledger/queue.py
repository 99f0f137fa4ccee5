"""The run queue: how a run's task reaches the run cluster, and which runs have one coming.

Runs go to their own queue, `settings.LOOPSWEB_RUN_CLUSTER`, served by the run cluster
(`Q_CLUSTER_NAME=loopsweb-runs manage.py qcluster`, LOOPSWEB_RUN_WORKERS workers); everything
else (drains, schedules, recovery) stays on the main cluster's queue. The task itself is
`runs.tasks.run_workflow` (`RUN_TASK`, a dotted path stored in broker rows and schedules).

Below the services (which enqueue retries and resumed loops) and above nothing of the ledger
but django-q2: the services import it at module level.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db.models import Q
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.signing import BadSignature, SignedPackage
from django_q.tasks import async_task

from ledger.dberrors import OutageNotice, drop_connection, error_passes
from ledger.hosts import (
    WAIT_CHECKING,
    WAIT_MISSING,
    dead_after,
    host_name,
    host_queue,
    inside,
    live_hosts,
    project_here,
    projects_record,
    registered_hosts,
    run_placement,
    run_wait_record,
)
from ledger.models import Host, RunStatus, WorkflowRun

logger = logging.getLogger(__name__)

RUN_TASK = "runs.tasks.run_workflow"
# A queued or parked run with no task in the broker for this long is handed out again. The
# recovery schedule runs every minute (checked every ~30 s), so a lost run is found within
# about two minutes.
LOST_TASK_AFTER = timedelta(seconds=30)
# PatientQueue.due's statement per (database vendor, number of queues).
_DUE_SQL: dict[tuple[str, int], str] = {}
# How often an idle broker poll lets django-q2 check its kept connection (PatientQueue.due).
CONNECTION_CHECK_SECONDS = 30.0


def enqueue_run_workflow(
    run_id: str,
    *,
    not_before: datetime | None = None,
    steps: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """Hand an admitted run to the runner, visible exactly when the admission commits.

    - ORM broker (the default): the task row is written inside the admitting transaction, so
      it commits or rolls back with the admission (nothing lost, nothing half-written) and a
      worker never sees it before the run exists. Inside a transaction django-q2 also skips
      the close-and-reconnect it does before every autocommit enqueue, which was most of an
      admission's cost.
    - Any other broker, or sync mode: on_commit, so a rolled-back admission never starts a run.
    Delivery is at least once; the runner's conditional claim makes a second delivery a no-op.

    `not_before` (a retry's backoff): the run is handed over then, through a one-off
    django-q2 schedule (which fires up to ~30 s late; the claim never starts it early).
    `steps` (the run's workflow steps, when the caller has them): where the run can go is
    read from them, not from the run's row (a batched admission inserts its runs later).
    """
    # Sync mode (debugging) would run the whole workflow inside the admission: on_commit.
    if (
        Conf.ORM
        and not Conf.SYNC
        and transaction.get_connection(Conf.ORM).in_atomic_block
    ):
        enqueue_run(run_id, not_before, steps=steps)
    else:
        transaction.on_commit(lambda: enqueue_run(run_id, not_before, steps=steps))


def enqueue_run(
    run_id: str,
    not_before: datetime | None = None,
    *,
    delay: float = 0.0,
    exclude: Collection[str] = (),
    steps: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """The run's task on the queue of a host that serves it (ledger.hosts placement, never
    one in `exclude`): now, in `delay` seconds, or at `not_before` (written at once, in or
    out of a transaction; `enqueue_run_workflow` is the admission's). With no live host
    serving it, no task: the run records why it waits."""
    if not_before is not None and not_before > timezone.now():
        # One schedule per run (by name): a second hand-over moves it, never duplicates it.
        # It fires on the main cluster (the one that runs schedules) and queues the task on
        # the run cluster's queue (q_options cluster).
        Schedule.objects.update_or_create(
            name=f"run-workflow-{run_id}",
            defaults={
                "func": RUN_TASK,
                "args": repr((run_id,)),
                "kwargs": repr(
                    {"q_options": {"cluster": settings.LOOPSWEB_RUN_CLUSTER}}
                ),
                "schedule_type": Schedule.ONCE,
                "repeats": -1,
                "next_run": not_before,
            },
        )
        return
    placement = run_placement(run_id, exclude=exclude, steps=steps)
    if placement.wait_reason is not None:
        # No live host serves it: no task; the recovery schedule places it again (it has no
        # task) and fails it after LOOPSWEB_NO_HOST_GRACE_SECONDS with this reason.
        run_wait_record(run_id, placement)
        return
    if placement.host is not None and steps is None:
        run_wait_record(run_id, None)  # a new run (steps given) has no reason to clear
    options: dict[str, object] = {"cluster": placement.queue}
    if delay > 0 and (broker := delayed_broker(placement.queue, delay)) is not None:
        options["broker"] = broker
    async_task(RUN_TASK, run_id, task_name=f"run-workflow-{run_id}", **options)


def main_task(
    func: str, *args: Any, task_name: str, group: str | None = None, delay: float = 0.0
) -> None:
    """Queue `func` (a dotted path) on the main cluster's queue, where drains and
    schedules run, visible after `delay` seconds."""
    cluster = str(settings.Q_CLUSTER["name"])
    options: dict[str, Any] = {"cluster": cluster}
    if group:
        options["group"] = group
    if delay > 0 and (broker := delayed_broker(cluster, delay)) is not None:
        options["broker"] = broker
    async_task(func, *args, task_name=task_name, **options)


def delayed_broker(list_key: str, delay: float) -> ORM | None:
    """A broker for `list_key` whose task becomes visible `delay` s from now (the ORM
    broker, which loopsweb configures; None with any other: the task is visible at once)."""
    return _DelayedOrm(list_key, delay) if Conf.ORM else None


class _DelayedOrm(ORM):
    """The ORM broker, but the task becomes visible `delay` seconds from now.

    The ORM broker hands out rows whose `lock` is in the past; a row written with a future
    lock waits in the queue until then, with no worker held. (Other brokers have no such
    field; loopsweb configures the ORM broker.)
    """

    def __init__(self, list_key: str, delay: float) -> None:
        super().__init__(list_key=list_key)
        self.delay = delay

    def enqueue(self, task: str) -> int:
        visible = timezone.now() + timedelta(seconds=self.delay)
        row = self.get_connection().create(
            key=self.list_key, payload=task, lock=visible
        )
        return int(row.pk)


class PatientQueue(ORM):
    """The ORM broker, patient with the database (Q_CLUSTER `broker_class`): a passing
    database error while fetching tasks is one warning line per outage and a pause, not a
    traceback and a pusher process the sentinel must start again (ledger.dberrors)."""

    notice = OutageNotice("the task queue")

    def dequeue(self) -> list[tuple[int, str]] | None:
        try:
            found = self.fetch()
        except DatabaseError as exc:
            if not error_passes(exc):
                raise
            self.notice.failed(exc)
            drop_connection()
            time.sleep(max(Conf.POLL, 1.0))
            return None
        self.notice.ok()
        if found:
            return found
        time.sleep(Conf.POLL)
        return None

    def keys(self) -> tuple[str, ...]:
        """The queues this broker serves, in the order it takes from them."""
        return (self.list_key,)

    def fetch(self) -> list[tuple[int, str]]:
        keys = self.keys()
        if not self.due(keys):
            return []
        for key in keys:
            if taken := self.take(key):
                return taken
        return []

    # When the poll last let django-q2 close a connection too old or unusable (monotonic).
    _connection_checked = -CONNECTION_CHECK_SECONDS

    def due(self, keys: Sequence[str]) -> bool:
        """Whether a row of `keys` is due: the one statement of an idle poll (every Conf.POLL
        seconds in every cluster), written once and sent as it is. Built through the ORM, the
        run cluster's two queries of an idle poll were about 0.37 ms of CPU, this is 0.03
        (SQLite, a kept connection; measured).

        A kept connection (DATABASE_CONN_MAX_AGE above 0) is checked (its age, and its
        health: a `SELECT 1` before the next statement) once per CONNECTION_CHECK_SECONDS,
        not before every poll: a poll on a broken connection fails, and `dequeue` drops it
        and pauses, as after any outage. With 0, every poll closes it as before."""
        connection = connections[Conf.ORM]
        clock = time.monotonic()
        kept = bool(connection.settings_dict.get("CONN_MAX_AGE"))
        if not kept or clock - self._connection_checked >= CONNECTION_CHECK_SECONDS:
            self.get_connection()  # django-q2's: a connection too old or unusable is closed
            self._connection_checked = clock
        sql = _DUE_SQL.get((connection.vendor, len(keys)))
        if sql is None:
            name = connection.ops.quote_name
            sql = (
                f"SELECT 1 FROM {name(OrmQ._meta.db_table)} WHERE {name('key')} IN "
                f"({', '.join(['%s'] * len(keys))}) AND {name('lock')} < %s LIMIT 1"
            )
            _DUE_SQL[(connection.vendor, len(keys))] = sql
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        with connection.cursor() as cursor:
            cursor.execute(sql, [*keys, now])
            return cursor.fetchone() is not None

    def take(self, key: str) -> list[tuple[int, str]]:
        """Rows of queue `key` that are due, each taken with a compare-and-set on its lock
        (of two clusters, one takes a row)."""
        taken = []
        for row in self.get_connection().filter(key=key, lock__lt=timezone.now())[
            : Conf.BULK
        ]:
            if (
                self.get_connection()
                .filter(id=row.id, lock=row.lock)
                .update(lock=self.timeout(row))
            ):
                taken.append((row.pk, row.payload))
        return taken


class HostQueue(PatientQueue):
    """The run cluster's broker (Q_CLUSTER's run cluster `broker_class`): the ORM broker on
    this host's own queue (`loopsweb-runs@<LOOPSWEB_HOST_NAME>`), then on the shared run
    queue (tasks queued before any host registered, and retries' one-off schedules).

    Any other queue name (a task this cluster queues for another host) is the plain ORM
    broker on that name.
    """

    def __init__(self, list_key: str | None = None) -> None:
        shared = settings.LOOPSWEB_RUN_CLUSTER
        own = list_key in (None, shared)
        super().__init__(list_key=host_queue(host_name()) if own else list_key)
        self.also: str | None = shared if own else None

    def keys(self) -> tuple[str, ...]:
        return (self.list_key,) if self.also is None else (self.list_key, self.also)


def hand_back_elsewhere(run_id: str, project: str | None) -> None:
    """This host cannot serve the run (its project is not on this disk, ...): it records
    what it found, stays out of the run's placement until the run is claimed, and the run
    goes to a host that can serve it, or waits with its reason (ledger.hosts)."""
    if project is not None and (has := project_here(project)) is not None:
        projects_record({project: has})
    with transaction.atomic():
        row = (
            WorkflowRun.objects.select_for_update()
            .filter(pk=run_id)
            .values_list("pk", "hosts_declined")
            .first()
        )
        if row is None:
            return
        declined = list(row[1] or [])
        if host_name() not in declined:
            WorkflowRun.objects.filter(pk=run_id).update(
                hosts_declined=[*declined, host_name()]
            )
        enqueue_run(run_id)


# Paths a heartbeat checks at most (the rest at the next beat).
PROJECTS_CHECKED_PER_BEAT = 200
# A run waiting for the hosts to check its project is placed once every live host whose roots
# hold it has checked (so a burst spreads over all that have it), or after this long on the
# ones that have (a host that never checks does not hold it up).
CHECK_PATIENCE = timedelta(seconds=20)


def host_projects_refresh(now: datetime | None = None) -> list[str]:
    """A heartbeat of this host: check on its disk the projects other hosts know of and the
    ones queued runs wait for, unless it has found them already (a miss at delivery refreshes
    those); then place the waiting runs that can be decided now. Returns those runs."""
    now = now or timezone.now()
    hosts = registered_hosts()
    me = next((h for h in hosts if h.name == host_name()), None)
    if me is None:
        return []
    mine = me.projects or {}
    waiting = {
        run: (path, code, since)
        for run, path, code, since in WorkflowRun.objects.filter(
            status=RunStatus.QUEUED,
            host_wait_since__isnull=False,
            host_wait_code__in=(WAIT_CHECKING, WAIT_MISSING),
        ).values_list("id", "host_wait_project", "host_wait_code", "host_wait_since")[
            :1000
        ]
        if path
    }
    paths = {path for h in hosts for path in (h.projects or {})}
    paths.update(path for path, _, _ in waiting.values())
    found: dict[str, bool] = {}
    for path in sorted(paths):
        if mine.get(path) is True or len(found) >= PROJECTS_CHECKED_PER_BEAT:
            continue
        if (has := project_here(path)) is not None:
            found[path] = has
    projects_record(found)
    if not waiting:
        return []
    live = live_hosts(now, fresh=True)
    gained = {path for path, has in found.items() if has}

    def decided(path: str, code: str | None, since: datetime | None) -> bool:
        if code == WAIT_MISSING:
            return path in gained  # it was on no disk: this host has it now
        holders = [h for h in live if inside(path, h.roots or [])]
        checked = all(h.projects is None or path in h.projects for h in holders)
        return checked or (since is not None and since < now - CHECK_PATIENCE)

    placed = [run for run, row in waiting.items() if decided(*row)]
    if placed:
        WorkflowRun.objects.filter(id__in=placed).update(hosts_declined=[])
        for run_id in placed:
            enqueue_run(run_id)
    return placed


def hand_back_run(run_id: str, delay: float) -> None:
    """The runner's hand-back: the run's task again, due in `delay` seconds."""
    enqueue_run(run_id, delay=delay)


def run_id_of(payload: str) -> str | None:
    try:
        task = SignedPackage.loads(payload)
    except (BadSignature, TypeError, ValueError):
        return None
    args = task.get("args") or ()
    if task.get("func") == RUN_TASK and args:
        return str(args[0])
    return None


def _place_again(run_ids: Collection[str], exclude: Collection[str]) -> list[str]:
    """Queue again the runs of `run_ids` that are waiting (queued, or parked)."""
    waiting = WorkflowRun.objects.filter(id__in=list(run_ids)).filter(
        Q(status=RunStatus.QUEUED)
        | Q(status=RunStatus.RUNNING, claimed_by__isnull=True)
    )
    placed = []
    for run_id in waiting.values_list("id", flat=True):
        enqueue_run(run_id, exclude=exclude)
        placed.append(run_id)
    return placed


def host_queue_release_fetched(now: datetime | None = None) -> list[str]:
    """A run cluster starting on this host: the tasks a previous cluster of this host had
    fetched and not finished (it was killed and restarted within LOOPSWEB_HOST_DEAD_SECONDS,
    so no other host saw it dead) are queued again now instead of after Q_RETRY.

    Fetched rows are those locked further ahead than any hand-back delay (which is at most
    LOOPSWEB_STEP_START_POLL_SECONDS). A row this very cluster fetched meanwhile may be among
    them: its run is then delivered twice, and the runner's conditional claim makes the
    second delivery a no-op. Returns the runs queued again.
    """
    now = now or timezone.now()
    ahead = now + timedelta(
        seconds=max(60, 2 * int(settings.LOOPSWEB_STEP_START_POLL_SECONDS))
    )
    with transaction.atomic():
        rows = list(
            OrmQ.objects.using(Conf.ORM or "default")
            .filter(key=host_queue(host_name()), lock__gt=ahead)
            .values_list("pk", "payload")
        )
        if not rows:
            return []
        OrmQ.objects.using(Conf.ORM or "default").filter(
            pk__in=[pk for pk, _ in rows]
        ).delete()
        placed = _place_again(
            [run_id for _, payload in rows if (run_id := run_id_of(payload))], ()
        )
    if placed:
        logger.warning(
            "host %s: %d runs its previous run cluster had fetched queued again",
            host_name(),
            len(placed),
        )
    return placed


def hosts_release_dead(now: datetime | None = None) -> list[str]:
    """Empty the queues of dead hosts (not seen for LOOPSWEB_HOST_DEAD_SECONDS) into the live
    hosts' queues at once; the ids of the runs placed again.

    Every row of a dead host's queue goes: waiting rows and rows its cluster had fetched
    (locked until fetch + Q_RETRY) alike, so nothing waits Q_RETRY. Queued runs and parked
    runs are placed again (a parked run whose worktree is on the dead host waits for it);
    runs it was running keep their lease, and lease recovery fails (or retries) them. Each
    host is taken with a skip-locked row lock: of two live hosts sweeping at once, one
    releases it. Called by every run worker's heartbeat and by the recovery schedule.
    """
    now = now or timezone.now()
    moved: list[str] = []
    dead = list(
        Host.objects.filter(
            seen_at__lt=now - dead_after(), released_at__isnull=True
        ).values_list("pk", flat=True)
    )
    for pk in dead:
        with transaction.atomic():
            host = (
                Host.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, seen_at__lt=now - dead_after(), released_at__isnull=True)
                .first()
            )
            if host is None:
                continue
            rows = list(
                OrmQ.objects.using(Conf.ORM or "default")
                .filter(key=host.queue)
                .values_list("pk", "payload")
            )
            ids = [run_id for _, payload in rows if (run_id := run_id_of(payload))]
            OrmQ.objects.using(Conf.ORM or "default").filter(
                pk__in=[pk for pk, _ in rows]
            ).delete()
            Host.objects.filter(pk=host.pk).update(released_at=now)
            moved += _place_again(ids, {host.name})
        logger.warning(
            "host %s is dead (last seen %s): %d queued runs placed again",
            host.name,
            host.seen_at,
            len(moved),
        )
    return moved


def runs_with_a_task() -> set[str]:
    """Ids of the runs that have a task coming: a broker row (waiting, delayed or being
    executed) or a pending one-off schedule (a retry waiting for its backoff).

    Reads the ORM broker's rows and opens their signed payloads; a row this installation
    cannot read (signed with another key) does not count, so its run is enqueued again.
    """
    ids: set[str] = set()
    rows = OrmQ.objects.using(Conf.ORM or "default").values_list("payload", flat=True)
    for payload in rows.iterator():
        run_id = run_id_of(payload)
        if run_id is not None:
            ids.add(run_id)
    scheduled = (
        Schedule.objects.filter(func=RUN_TASK, name__startswith="run-workflow-")
        .exclude(repeats=0)  # fired (django-q2 keeps a ONCE schedule it did not delete)
        .values_list("name", flat=True)
    )
    ids.update(name.removeprefix("run-workflow-") for name in scheduled)
    return ids
