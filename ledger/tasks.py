"""django-q2 tasks of the ledger: thin adapters that call one service each. Their dotted
paths (`ledger.tasks.run_workflow`, …) are stored in schedules and queued tasks: they never move."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import Schedule
from django_q.tasks import async_task

from ledger.models import WorkflowRun
from ledger.runner import NOT_DUE, run_workflow_run
from ledger.services import runs_queued_stale, runs_recover_expired
from ledger.worktrees import worktrees_prune


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
        _enqueue(run_id, not_before)
    else:
        transaction.on_commit(lambda: _enqueue(run_id, not_before))


def _enqueue(run_id: str, not_before: datetime | None = None) -> None:
    if not_before is not None and not_before > timezone.now():
        # One schedule per run (by name): a second hand-over moves it, never duplicates it.
        Schedule.objects.update_or_create(
            name=f"run-workflow-{run_id}",
            defaults={
                "func": "ledger.tasks.run_workflow",
                "args": repr((run_id,)),
                "kwargs": None,
                "schedule_type": Schedule.ONCE,
                "repeats": -1,
                "next_run": not_before,
            },
        )
        return
    async_task("ledger.tasks.run_workflow", run_id, task_name=f"run-workflow-{run_id}")


def run_workflow(run_id: str) -> str:
    """django-q2 task: execute one admitted run (idempotent: a second delivery is a no-op).

    A retry delivered before its backoff ended (a stale-run hand-over) is handed over again
    for its due time."""
    result = run_workflow_run(run_id)
    if result == NOT_DUE:
        due = (
            WorkflowRun.objects.filter(pk=run_id)
            .values_list("scheduled_for", flat=True)
            .first()
        )
        if due is not None:
            _enqueue(run_id, due)
    return result


def recover_expired_runs() -> int:
    """django-q2 task (every minute): fail running runs whose worker lease expired, and hand
    queued runs whose task was lost (older than the broker's retry window) to the runner again."""
    recovered = len(runs_recover_expired())
    for run_id in runs_queued_stale(
        older_than=timedelta(seconds=settings.Q_CLUSTER["retry"])
    ):
        _enqueue(run_id)
    return recovered


def prune_worktrees() -> int:
    """django-q2 task (periodic): remove the worktrees of finished runs that are due
    (succeeded runs' leftovers, failed runs' after LOOPSWEB_WORKTREE_KEEP_SECONDS)."""
    return len([p for p in worktrees_prune() if p.error is None])
