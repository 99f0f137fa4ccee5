"""Recovery of runs whose worker or task is gone: running runs whose lease expired are
failed (their process groups on this host killed), queued and parked runs whose task may be
lost are handed out again; `run_work_saved` records the work an ended run had left
uncommitted in its worktree once it is committed on the run's branch (runs.run_worktree:
`save_left_work`, after recovery and before a prune).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.lock import admission_lock
from ledger.models import (
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
)
from ledger.reaper import kill_leftovers
from ledger.services.cascade import end_run, finish_open_steps
from ledger.services.common import (
    LEASE_EXPIRED_ITEM_REASON,
    LEASE_EXPIRED_RUN_ERROR,
    LEASE_EXPIRED_STEP_ERROR,
    OPEN_STEP_STATUSES,
    append_event,
    clean_text,
    lock_run,
    now_or_default,
)

logger = logging.getLogger(__name__)


# Most runs handed out again per call of runs_queued_stale (per kind).
STALE_BATCH = 500
# Paths named in a `work_saved` event (the diffstat has the rest).
SAVED_PATHS_NAMED = 20


@dataclass(frozen=True)
class RecoveredRun:
    run_id: str
    workflow_name: str
    claimed_by: str | None
    lease_expires_at: datetime | None
    work_item_id: str | None
    failed_steps: list[str] = field(default_factory=list)
    skipped_steps: list[str] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "workflowName": self.workflow_name,
            "claimedBy": self.claimed_by,
            "leaseExpiresAt": self.lease_expires_at.isoformat()
            if self.lease_expires_at
            else None,
            "workItemId": self.work_item_id,
            "failedSteps": self.failed_steps,
            "skippedSteps": self.skipped_steps,
            "killedPids": self.killed_pids,
        }


def runs_recover_expired(
    *, now: datetime | None = None, dry_run: bool = False
) -> list[RecoveredRun]:
    """Fail `running` runs whose lease expired before `now` (their worker is gone).

    Per run, in its own short transaction (re-checked under the run lock, so a worker that
    renewed meanwhile keeps its run):
    1. running steps → failed, error `worker lease expired before completion (claimed_by=…)`;
       pending steps → skipped.
    2. run → failed with `workflow run lease expired before completion (claimed_by=…)`.
    3. work item (admitted/running) → failed, reason
       `parent loop run lease expired before completion`; loop and spec as in `run_finalize`.
    4. After commit, a step process group still alive on this host is killed.
    Freed: the failed steps no longer count as account load, the item no longer as active.
    Queued runs carry no lease and are never touched. `dry_run` only lists what would change.
    """
    now = now_or_default(now)
    expired = list(
        WorkflowRun.objects.filter(
            status=RunStatus.RUNNING,
            lease_expires_at__lt=now,
            claimed_by__isnull=False,  # parked runs (run_park) hold no process
        )
        .order_by("lease_expires_at")
        .values_list("id", flat=True)
    )
    results: list[RecoveredRun] = []
    for run_id in expired:
        if dry_run:
            run = WorkflowRun.objects.get(pk=run_id)
            steps = list(
                WorkflowStepRun.objects.filter(
                    workflow_run_id=run_id, status__in=OPEN_STEP_STATUSES
                ).order_by("sequence")
            )
            results.append(
                RecoveredRun(
                    run_id=run.id,
                    workflow_name=run.workflow_name,
                    claimed_by=run.claimed_by,
                    lease_expires_at=run.lease_expires_at,
                    work_item_id=run.work_item_id,
                    failed_steps=[
                        s.step_id for s in steps if s.status == StepStatus.RUNNING
                    ],
                    skipped_steps=[
                        s.step_id for s in steps if s.status == StepStatus.PENDING
                    ],
                )
            )
            continue
        recovered = _recover_run(run_id, now)
        if recovered is not None:
            results.append(recovered)
    return results


def _recover_run(run_id: str, now: datetime) -> RecoveredRun | None:
    with transaction.atomic():
        admission_lock()
        run = lock_run(run_id)
        if (
            run.status != RunStatus.RUNNING
            or run.claimed_by is None
            or run.lease_expires_at is None
            or run.lease_expires_at >= now
        ):
            return None  # renewed, parked or finished since the scan
        lease_expires_at = run.lease_expires_at
        claimed_by = run.claimed_by
        pending = list(
            WorkflowStepRun.objects.filter(
                workflow_run_id=run.id, status=StepStatus.PENDING
            ).values_list("step_id", flat=True)
        )
        was_running = finish_open_steps(
            run,
            pending_to=StepStatus.SKIPPED,
            running_to=StepStatus.FAILED,
            error=LEASE_EXPIRED_STEP_ERROR.format(claimed_by=claimed_by),
            now=now,
        )
        end_run(
            run,
            status=RunStatus.FAILED,
            error=LEASE_EXPIRED_RUN_ERROR.format(claimed_by=claimed_by),
            item_reason=LEASE_EXPIRED_ITEM_REASON,
            now=now,
            event_payload={"recovery": "lease_expired", "claimedBy": claimed_by},
        )
    killed = kill_leftovers(was_running, claimed_by)
    logger.warning(
        "recovered workflow run %s (lease expired %s, claimed_by=%s)",
        run_id,
        lease_expires_at,
        claimed_by,
    )
    return RecoveredRun(
        run_id=run.id,
        workflow_name=run.workflow_name,
        claimed_by=claimed_by,
        lease_expires_at=lease_expires_at,
        work_item_id=run.work_item_id,
        failed_steps=[s.step_id for s in was_running],
        skipped_steps=pending,
        killed_pids=killed,
    )


def runs_queued_stale(
    *,
    older_than: timedelta,
    now: datetime | None = None,
    with_task: Collection[str] = (),
) -> list[str]:
    """Runs waiting for a task that may be gone: ids to enqueue again.

    - `queued` runs untouched for `older_than`;
    - parked runs (`run_park`) whose task was due more than `older_than` ago.
    Runs in `with_task` (the caller saw their task in the broker) are left alone. Each returned
    run is bumped (updated_at, or a parked run's due time), so a run is handed out again at
    most once per window however often this is called; the runner's conditional claim and
    resume make any duplicate delivery a no-op.
    """
    now = now or timezone.now()
    cutoff = now - older_than
    skip = set(with_task)
    with transaction.atomic():
        # Ids only, filtered here: `with_task` can hold thousands of ids (a backlog waiting
        # for run workers), too many for an IN list.
        queued = [
            run_id
            for run_id in WorkflowRun.objects.filter(
                status=RunStatus.QUEUED, updated_at__lt=cutoff
            )
            .order_by("created_at")
            .values_list("id", flat=True)
            if run_id not in skip
        ][:STALE_BATCH]
        WorkflowRun.objects.filter(id__in=queued, status=RunStatus.QUEUED).update(
            updated_at=now
        )
        parked = [
            run_id
            for run_id in WorkflowRun.objects.filter(
                status=RunStatus.RUNNING,
                claimed_by__isnull=True,
                lease_expires_at__lt=cutoff,
            )
            .order_by("lease_expires_at")
            .values_list("id", flat=True)
            if run_id not in skip
        ][:STALE_BATCH]
        WorkflowRun.objects.filter(
            id__in=parked, status=RunStatus.RUNNING, claimed_by__isnull=True
        ).update(lease_expires_at=now, updated_at=now)
    return queued + parked


NO_HOST_RUN_ERROR = "no host could take the run for {seconds} s: {reason}"


def runs_fail_unserved(*, grace: timedelta, now: datetime | None = None) -> list[str]:
    """Fail `queued` runs no live host has served for `grace` (LOOPSWEB_NO_HOST_GRACE_SECONDS),
    with the reason they waited (ledger.hosts: "no host serves /srv/p for codex").

    Per run, in its own transaction under the admission lock, re-checked under the run lock
    (a host that took the run meanwhile keeps it): pending steps skipped, the run failed, its
    work item failed with the same reason (a loop-level retry as for any failure), so its
    cap slot and account reservation are freed.
    """
    now = now_or_default(now)
    cutoff = now - grace
    waiting = list(
        WorkflowRun.objects.filter(
            status=RunStatus.QUEUED, host_wait_since__lt=cutoff
        ).values_list("id", flat=True)[:STALE_BATCH]
    )
    failed: list[str] = []
    for run_id in waiting:
        with transaction.atomic():
            admission_lock()
            run = lock_run(run_id)
            if (
                run.status != RunStatus.QUEUED
                or run.host_wait_since is None
                or run.host_wait_since >= cutoff
            ):
                continue
            reason = NO_HOST_RUN_ERROR.format(
                seconds=int(grace.total_seconds()), reason=run.host_wait_reason
            )
            finish_open_steps(
                run,
                pending_to=StepStatus.SKIPPED,
                running_to=StepStatus.FAILED,
                error=reason,
                now=now,
            )
            end_run(
                run,
                status=RunStatus.FAILED,
                error=reason,
                item_reason=reason,
                now=now,
                event_payload={"recovery": "no_host", "reason": run.host_wait_reason},
            )
        logger.warning("failed workflow run %s: %s", run_id, reason)
        failed.append(run_id)
    return failed


def run_work_saved(
    *, run_id: str, head: str, diffstat: str, paths: list[str], why: str
) -> None:
    """Record the commit of what the ended run had left uncommitted in its worktree: its
    head and diffstat as the runner's own commit records them, and an event `work_saved`
    (the commit, how many paths, the first of them, and `why`: recovery or prune)."""
    with transaction.atomic():
        lock_run(run_id)
        WorkflowRun.objects.filter(pk=run_id).update(
            commit_head=head,
            commit_diffstat=clean_text(diffstat) or "",
            commit_error=None,
        )
        append_event(
            run_id,
            "work_saved",
            payload={
                "commit": head,
                "paths": len(paths),
                "first": [clean_text(p) for p in paths[:SAVED_PATHS_NAMED]],
                "why": why,
            },
        )
