"""Workflow runs after admission: claim, park and resume, lease renewal, the worktree
record, finalize and cancel. The end of a run and its cascade are `ledger.services.cascade`;
retries `ledger.services.retries`; lease recovery `ledger.services.recovery`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from domain.errors import ValidationError
from ledger.lock import admission_lock
from ledger.models import (
    TERMINAL_RUN_STATUSES,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.reaper import kill_leftovers
from ledger.services.cascade import cancel_locked_run, end_run, finish_open_steps
from ledger.services.common import (
    CANCEL_REASON_DEFAULT,
    REASON_REQUIRED,
    RUN_ALREADY_TERMINAL,
    RUN_STATUS_NOT_TERMINAL,
    RUNNABLE_STATUSES,
    WORK_ITEM_NOT_RUNNABLE,
    LedgerError,
    append_event,
    clean_text,
    lease_duration,
    lock_run,
    now_or_default,
    worker_host,
)


def run_claim(
    *, run_id: str, worker: str, now: datetime | None = None
) -> WorkflowRun | None:
    """Claim a `queued` run for `worker`; None when it is not queued (a second delivery).

    1. Conditional UPDATE queued → running: exactly one row, or nothing happens. A retry
       whose `scheduled_for` (backoff) is still ahead is not claimed either.
    2. The run gets started_at, claimed_by and a lease (LOOPSWEB_RUN_LEASE_SECONDS).
    3. Its work item goes `running` (docs/upstream.md §2.1: from admitted/queued/deferred/running)
       with workflow_run bound and lease_expires_at = now + the loop's lease_ms (upstream).
       An item no longer runnable (an operator ended it) cancels the run instead, with
       upstream's `workflow work item is not runnable` message, and None is returned.
    4. Event `claimed` (loopsweb: upstream runs are created running).
    """
    now = now_or_default(now)
    with transaction.atomic():
        # The admission lock first (lock order; the item becomes `running`). The UPDATE below
        # is the compare-and-set: whoever changes the row owns the run.
        admission_lock()
        # A retry is due at `scheduled_for` (its backoff): never claimed before then.
        claimed = WorkflowRun.objects.filter(
            Q(scheduled_for__isnull=True) | Q(scheduled_for__lte=now),
            pk=run_id,
            status=RunStatus.QUEUED,
        ).update(
            status=RunStatus.RUNNING,
            started_at=now,
            claimed_by=worker,
            lease_expires_at=now + lease_duration(),
            updated_at=now,
            host=worker_host(worker),
            host_wait_reason=None,
            host_wait_since=None,
            host_wait_code=None,
            host_wait_project=None,
            hosts_declined=[],
        )
        if claimed != 1:
            return None
        run = lock_run(run_id)
        # The item goes `running` with a conditional UPDATE; only when it is no longer
        # runnable is it read, to say why.
        item = None
        if run.work_item_id:
            lease_ms = run.loop.lease_ms if run.loop else None
            claimed_item = WorkflowWorkItem.objects.filter(
                pk=run.work_item_id, status__in=RUNNABLE_STATUSES
            ).update(
                status=WorkItemStatus.RUNNING,
                workflow_run_id=run.id,
                lease_expires_at=now + timedelta(milliseconds=lease_ms)
                if lease_ms
                else run.lease_expires_at,
                updated_at=now,
            )
            if not claimed_item:
                item = WorkflowWorkItem.objects.filter(pk=run.work_item_id).first()
        if item is not None and item.status not in RUNNABLE_STATUSES:
            # The item is ended already: its reason and the steps' stay as they are.
            cancel_locked_run(
                run,
                reason=WORK_ITEM_NOT_RUNNABLE.format(
                    item_id=item.id, status=item.status
                ),
                now=now,
                run_only=True,
            )
            return None
        append_event(
            run.id,
            "claimed",
            payload={
                "claimedBy": worker,
                "leaseExpiresAt": run.lease_expires_at.isoformat()
                if run.lease_expires_at
                else None,
            },
        )
    return run


def run_park(
    *, run_id: str, worker: str, resume_at: datetime, now: datetime | None = None
) -> bool:
    """Hand a running run back to the queue while its next step waits for its account.

    The run stays `running` (its item stays active, its pending steps keep counting toward
    their accounts) but no worker holds it: `claimed_by` is cleared and `lease_expires_at`
    becomes `resume_at`, when its task is due again. Lease recovery leaves such a run alone
    (it has no process to lose); a parked run whose task is lost is handed out again like a
    queued one (`runs_awaiting_task`). False when the run is no longer this worker's.
    """
    now = now_or_default(now)
    with transaction.atomic():
        parked = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by=worker
        ).update(claimed_by=None, lease_expires_at=resume_at, updated_at=now)
    return parked == 1


def run_resume(
    *, run_id: str, worker: str, now: datetime | None = None
) -> WorkflowRun | None:
    """Take a parked run (running, held by no worker) for `worker`; None when it is not parked.

    A conditional UPDATE, like the claim: of two deliveries of the same task, one resumes
    the run and the other changes nothing. The run gets a fresh lease.
    """
    now = now_or_default(now)
    with transaction.atomic():
        resumed = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by__isnull=True
        ).update(
            claimed_by=worker,
            lease_expires_at=now + lease_duration(),
            updated_at=now,
            host=worker_host(worker),
        )
    if resumed != 1:
        return None
    return WorkflowRun.objects.select_related("workflow").get(pk=run_id)


def run_lease_renew(*, run_id: str, worker: str, now: datetime | None = None) -> bool:
    """Extend a running run's lease; False when the run is no longer this worker's.

    False means it was cancelled, finalized or recovered meanwhile: the runner must stop its
    process and write nothing more for the run. A single conditional UPDATE, so it is cheap
    enough to run every third of a lease.
    """
    now = now_or_default(now)
    with transaction.atomic():
        renewed = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by=worker
        ).update(lease_expires_at=now + lease_duration(), updated_at=now)
    return renewed == 1


def run_worktree_record(
    *,
    run_id: str,
    worker: str,
    path: str | None,
    branch: str | None,
    now: datetime | None = None,
) -> bool:
    """Record (or, with None, clear) a running run's worktree; False when the run is no
    longer this worker's. The runner records it before `git worktree add`, so a worker that
    dies half-way leaves a worktree the prune task knows of."""
    now = now_or_default(now)
    with transaction.atomic():
        updated = WorkflowRun.objects.filter(
            pk=run_id, status=RunStatus.RUNNING, claimed_by=worker
        ).update(
            worktree_path=path,
            worktree_branch=branch,
            worktree_host=worker_host(worker) if path else None,
            updated_at=now,
        )
    return updated == 1


def run_worktree_removed(*, run_id: str, now: datetime | None = None) -> None:
    """Mark a run's worktree as gone (after `runs.worktrees.worktree_remove`)."""
    now = now_or_default(now)
    with transaction.atomic():
        WorkflowRun.objects.filter(pk=run_id, worktree_path__isnull=False).update(
            worktree_removed_at=now
        )


def run_commit_record(*, run_id: str, head: str, diffstat: str) -> None:
    """Record what a run left on its branch (`runs.worktrees.worktree_commit`)."""
    WorkflowRun.objects.filter(pk=run_id).update(
        commit_head=head, commit_diffstat=clean_text(diffstat) or "", commit_error=None
    )


def run_commit_failed(*, run_id: str, error: str) -> None:
    """Record why a run's work was not committed and where it is kept (the worktree)."""
    WorkflowRun.objects.filter(pk=run_id).update(commit_error=clean_text(error))


def run_finalize(
    *,
    run_id: str,
    status: str,
    error: str | None = None,
    now: datetime | None = None,
) -> WorkflowRun:
    """End a run with a terminal status and cascade (docs/upstream.md §2.1, §2.3).

    1. Only a non-terminal run (else `RUN_ALREADY_TERMINAL`). Steps still open are closed:
       pending → skipped (cancelled for a cancelled run), running → the run's status.
    2. The run gets status, finished_at, duration_ms, error; its lease is cleared; event
       `<status>`.
    3. Its work item, while admitted/running: succeeded → succeeded, failed/timed_out →
       failed (one-shot loops have max_attempts 1), cancelled → cancelled;
       `last_reason = COALESCE(error, last_reason)`; lease cleared.
    4. A one-shot loop with no other open run → `stopped`, next_run_at cleared.
    5. A generated one-shot route spec is archived (`workflow_archived`, reason
       `terminal generated one-shot route workflow`) when the docs/upstream.md §2.3 conditions hold.
    """
    if status not in TERMINAL_RUN_STATUSES:
        raise LedgerError(RUN_STATUS_NOT_TERMINAL.format(status=status))
    now = now_or_default(now)
    with transaction.atomic():
        admission_lock()
        run = lock_run(run_id)
        if run.status in TERMINAL_RUN_STATUSES:
            raise LedgerError(
                RUN_ALREADY_TERMINAL.format(run_id=run.id, status=run.status)
            )
        cancelled = status == RunStatus.CANCELLED
        finish_open_steps(
            run,
            pending_to=StepStatus.CANCELLED if cancelled else StepStatus.SKIPPED,
            running_to=StepStatus.CANCELLED
            if cancelled
            else (
                StepStatus.TIMED_OUT
                if status == RunStatus.TIMED_OUT
                else StepStatus.FAILED
            ),
            error=None,
            now=now,
        )
        end_run(run, status=status, error=error, item_reason=error, now=now)
    return run


def run_cancel(
    *,
    run_id: str,
    reason: str = CANCEL_REASON_DEFAULT,
    actor: str | None = None,
    now: datetime | None = None,
) -> WorkflowRun:
    """Cancel a queued or running run (docs/upstream.md §2.3 run cancel).

    Pending/running steps → cancelled, run → cancelled (error = reason), its active work item
    → cancelled with the reason, loop and spec as in `run_finalize`. The runner notices at its
    next lease renewal and kills its process group; if the step's process group is still
    alive on this host it is killed here too (the runner may be gone).
    """
    if not reason or not reason.strip():
        raise ValidationError(REASON_REQUIRED)
    now = now_or_default(now)
    with transaction.atomic():
        admission_lock()
        run = lock_run(run_id)
        if run.status in TERMINAL_RUN_STATUSES:
            raise LedgerError(
                RUN_ALREADY_TERMINAL.format(run_id=run.id, status=run.status)
            )
        was_running = cancel_locked_run(
            run,
            reason=reason,
            now=now,
            # an operator's cancel names the user in the run's `cancelled` event
            event_payload={"reason": reason, **({"user": actor} if actor else {})},
        )
    # After commit: signal processes only once the ledger says the run is over.
    kill_leftovers(was_running, run.claimed_by)
    return run
