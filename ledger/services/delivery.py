"""The records of a run's work after its steps: where it was delivered (`delivery_json`), a
step's commit, a discard. The one writer of each: runs.delivery, runs.discard and
runs.step_commits do the git and forge work and hand the outcome here.

1. `run_delivery_record`: the run's delivery record, whole (the mode and remote before any
   step, the outcome after); its error text cleaned of control characters. A `delivered`
   or `failed` record also appends the run's `delivered` / `delivery_failed` event, in the
   same transaction.
2. `run_pull_request_state`: the state of the run's pull request as the forge last said.
3. `step_commit_record`: a step's commit and its diffstat (cleaned).
4. `run_work_discarded`: the run's work discarded (its worktree removed, its branch
   deleted or not), with the `work_discarded` event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from ledger.models import WorkflowRun, WorkflowStepRun
from ledger.services.common import append_event, clean_text

# What a delivery event carries of the record.
_EVENT_KEYS = ("mode", "ref", "commit", "error")
_EVENT_EXTRAS = ("pr", "reviewers", "notes")


def run_delivery_record(run_id: str, record: dict[str, Any]) -> None:
    """Store `record` as the run's delivery record (module docstring,
    `run_delivery_record`)."""
    if record.get("error"):
        record["error"] = clean_text(record["error"])
    with transaction.atomic():
        WorkflowRun.objects.filter(pk=run_id).update(delivery_json=record)
        state = record.get("state")
        if state in ("delivered", "failed"):
            payload = {key: record.get(key) for key in _EVENT_KEYS}
            payload.update(
                {key: record[key] for key in _EVENT_EXTRAS if record.get(key)}
            )
            append_event(
                run_id,
                "delivered" if state == "delivered" else "delivery_failed",
                payload=payload,
            )


def run_pull_request_state(run: WorkflowRun, state: str) -> None:
    """The run's pull request is `state` now, as the forge says (module docstring,
    `run_pull_request_state`)."""
    record = dict(run.delivery_json or {})
    pr = record.get("pr")
    if not isinstance(pr, dict) or pr.get("state") == state:
        return
    record["pr"] = {**pr, "state": state}
    WorkflowRun.objects.filter(pk=run.id).update(delivery_json=record)


def step_commit_record(step_run_id: str, *, sha: str, diffstat: str) -> None:
    """A step's commit on the run's branch (module docstring, `step_commit_record`)."""
    WorkflowStepRun.objects.filter(pk=step_run_id).update(
        commit_sha=sha, commit_diffstat=clean_text(diffstat) or ""
    )


def run_work_discarded(
    run: WorkflowRun,
    *,
    worktree_removed: bool,
    branch_deleted: bool,
    reason: str | None,
    now: datetime,
) -> None:
    """The run's work is discarded (module docstring, `run_work_discarded`)."""
    fields: dict[str, Any] = {"work_discarded_at": now}
    if worktree_removed:
        fields["worktree_removed_at"] = now
    with transaction.atomic():
        WorkflowRun.objects.filter(pk=run.id).update(**fields)
        append_event(
            run.id,
            "work_discarded",
            payload={
                "branch": run.worktree_branch,
                "deleted": branch_deleted,
                "reason": reason,
            },
        )
