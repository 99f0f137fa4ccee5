"""django-q2 tasks of the ledger: thin adapters that call one service each. Their dotted
paths (`ledger.tasks.run_workflow`, …) are stored in schedules and queued tasks: they never move.

How a run's task is queued (the run cluster's queue, hand-back, the broker read) is
`ledger.queue`; this module holds only the entry points.
"""

from __future__ import annotations

from django_q.conf import Conf

from ledger.models import WorkflowRun
from ledger.queue import LOST_TASK_AFTER, enqueue_run, hand_back_run, runs_with_a_task
from ledger.runner import NOT_DUE, run_workflow_run
from ledger.services import runs_queued_stale, runs_recover_expired
from ledger.worktrees import worktrees_prune


def run_workflow(run_id: str) -> str:
    """django-q2 task: execute one admitted run (idempotent: a second delivery is a no-op).

    While a step waits for its account the run goes back to the queue (hand_back_run) instead
    of holding this worker; the next delivery resumes it. A retry delivered before its
    backoff ended (a stale-run hand-over) is handed over again for its due time.
    """
    # Sync mode (debugging) runs tasks inline: a hand-back would recurse, so wait inline.
    result = run_workflow_run(run_id, hand_back=None if Conf.SYNC else hand_back_run)
    if result == NOT_DUE:
        due = (
            WorkflowRun.objects.filter(pk=run_id)
            .values_list("scheduled_for", flat=True)
            .first()
        )
        if due is not None:
            enqueue_run(run_id, due)
    return result


def recover_expired_runs() -> int:
    """django-q2 task (every minute): fail running runs whose worker lease expired, and hand
    queued or parked runs whose task is gone (dropped, never delivered, row deleted) to the
    run cluster again."""
    recovered = len(runs_recover_expired())
    for run_id in runs_queued_stale(
        older_than=LOST_TASK_AFTER, with_task=runs_with_a_task()
    ):
        enqueue_run(run_id)
    return recovered


def prune_worktrees() -> int:
    """django-q2 task (periodic): remove the worktrees of finished runs that are due
    (succeeded runs' leftovers, failed runs' after LOOPSWEB_WORKTREE_KEEP_SECONDS)."""
    return len([p for p in worktrees_prune() if p.error is None])
