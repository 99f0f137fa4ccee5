"""The run queue: how a run's task reaches the run cluster, and which runs have one coming.

Runs go to their own queue, `settings.LOOPSWEB_RUN_CLUSTER`, served by the run cluster
(`Q_CLUSTER_NAME=loopsweb-runs manage.py qcluster`, LOOPSWEB_RUN_WORKERS workers); everything
else (drains, schedules, recovery) stays on the main cluster's queue. The task itself is
`ledger.tasks.run_workflow` (`RUN_TASK`, a dotted path stored in broker rows and schedules).

Below the services (which enqueue retries and resumed loops) and above nothing of the ledger
but django-q2: the services import it at module level.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.signing import BadSignature, SignedPackage
from django_q.tasks import async_task

RUN_TASK = "ledger.tasks.run_workflow"
# A queued or parked run with no task in the broker for this long is handed out again. The
# recovery schedule runs every minute (checked every ~30 s), so a lost run is found within
# about two minutes.
LOST_TASK_AFTER = timedelta(seconds=30)


def enqueue_run_workflow(run_id: str, *, not_before: datetime | None = None) -> None:
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
    """
    # Sync mode (debugging) would run the whole workflow inside the admission: on_commit.
    if (
        Conf.ORM
        and not Conf.SYNC
        and transaction.get_connection(Conf.ORM).in_atomic_block
    ):
        enqueue_run(run_id, not_before)
    else:
        transaction.on_commit(lambda: enqueue_run(run_id, not_before))


def enqueue_run(
    run_id: str, not_before: datetime | None = None, *, delay: float = 0.0
) -> None:
    """The run's task on the run cluster's queue: now, in `delay` seconds, or at `not_before`
    (written at once, in or out of a transaction; `enqueue_run_workflow` is the admission's)."""
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
    options: dict[str, object] = {"cluster": settings.LOOPSWEB_RUN_CLUSTER}
    if delay > 0 and Conf.ORM:
        options["broker"] = _DelayedOrm(settings.LOOPSWEB_RUN_CLUSTER, delay)
    async_task(RUN_TASK, run_id, task_name=f"run-workflow-{run_id}", **options)


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


def hand_back_run(run_id: str, delay: float) -> None:
    """The runner's hand-back: the run's task again, due in `delay` seconds."""
    enqueue_run(run_id, delay=delay)


def runs_with_a_task() -> set[str]:
    """Ids of the runs that have a task coming: a broker row (waiting, delayed or being
    executed) or a pending one-off schedule (a retry waiting for its backoff).

    Reads the ORM broker's rows and opens their signed payloads; a row this installation
    cannot read (signed with another key) does not count, so its run is enqueued again.
    """
    ids: set[str] = set()
    rows = OrmQ.objects.using(Conf.ORM or "default").values_list("payload", flat=True)
    for payload in rows.iterator():
        try:
            task = SignedPackage.loads(payload)
        except (BadSignature, TypeError, ValueError):
            continue
        args = task.get("args") or ()
        if task.get("func") == RUN_TASK and args:
            ids.add(str(args[0]))
    scheduled = (
        Schedule.objects.filter(func=RUN_TASK, name__startswith="run-workflow-")
        .exclude(repeats=0)  # fired (django-q2 keeps a ONCE schedule it did not delete)
        .values_list("name", flat=True)
    )
    ids.update(name.removeprefix("run-workflow-") for name in scheduled)
    return ids
