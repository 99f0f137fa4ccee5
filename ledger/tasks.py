"""django-q2 tasks of the ledger: thin adapters that call one service each."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django_q.tasks import async_task

from ledger.runner import run_workflow_run
from ledger.services import runs_queued_stale, runs_recover_expired


def enqueue_run_workflow(run_id: str) -> None:
    """Hand an admitted run to the runner once the admitting transaction has committed.

    on_commit: a rolled-back admission never starts a run, and the worker never looks for a
    run that is not yet visible. Delivery is at least once; the runner's claim makes a second
    delivery a no-op.
    """
    transaction.on_commit(
        lambda: async_task(
            "ledger.tasks.run_workflow", run_id, task_name=f"run-workflow-{run_id}"
        )
    )


def run_workflow(run_id: str) -> str:
    """django-q2 task: execute one admitted run (idempotent: a second delivery is a no-op)."""
    return run_workflow_run(run_id)


def recover_expired_runs() -> int:
    """django-q2 task (every minute): fail running runs whose worker lease expired, and hand
    queued runs whose task was lost (older than the broker's retry window) to the runner again."""
    recovered = len(runs_recover_expired())
    for run_id in runs_queued_stale(
        older_than=timedelta(seconds=settings.Q_CLUSTER["retry"])
    ):
        async_task(
            "ledger.tasks.run_workflow", run_id, task_name=f"run-workflow-{run_id}"
        )
    return recovered
