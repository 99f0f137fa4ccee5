"""One read of a work item's page: the admin's work-item page
(ledger.admin.work_items) and the /ops/ item page (routing.ops.views.work_item) both render
`work_item_read`, so they show the same runs, steps and attempts, with the same limits.

Queries, each bounded: the runs (at most RUNS_SHOWN, newest first), their step runs (one
query however many runs) and the steps' attempts (one). The step output (tails of up to LOOPSWEB_OUTPUT_TAIL_BYTES each) is read
only when the caller shows it (`output=True`). What other apps add to the page (routing's
inbox deliveries) they read themselves, as each page reads its deferral history (the admin
the latest few, /ops/ all of it, a page at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from ledger.models import (
    RevisionState,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemRevision,
)
from ledger.selectors import step_attempts

RUNS_SHOWN = 20

_RUN_FIELDS = (
    "id",
    "workflow_name",
    "status",
    "loop_id",
    "scheduled_for",
    "started_at",
    "finished_at",
    "created_at",
    "duration_ms",
    "error",
    "worktree_path",
    "worktree_branch",
    "worktree_removed_at",
    "commit_head",
    "commit_diffstat",
    "commit_error",
)
_STEP_FIELDS = (
    "id",
    "workflow_run_id",
    "step_id",
    "sequence",
    "status",
    "reason_code",
    "account_profile",
    "account_tool",
    "exit_code",
    "started_at",
    "finished_at",
    "duration_ms",
    "processes_ended",
    "egress_refused",
    "error",
    "usage_input_tokens",
    "usage_output_tokens",
    "usage_cached_tokens",
    "usage_cost_usd",
    "verdict",
    "verdict_text",
)


@dataclass(frozen=True)
class WorkItemRead:
    item: WorkflowWorkItem
    # Newest first, each with `attempt`: its number among the item's runs, oldest first (a
    # loop-level retry and a re-admission are each the next attempt, as the API numbers
    # them: routing.api.serializers.with_attempts).
    runs: list[WorkflowRun]
    steps: dict[str, list[WorkflowStepRun]]  # by run id, in step order
    attempts: dict[str, list[WorkflowStepAttempt]]  # by step run id, oldest first

    def every_step(self) -> list[WorkflowStepRun]:
        return [step for run in self.runs for step in self.steps.get(run.id, [])]


def work_item_runs(item_id: str, *, limit: int = RUNS_SHOWN) -> list[WorkflowRun]:
    """The item's latest runs, newest first, each with `attempt` (see WorkItemRead)."""
    return list(
        WorkflowRun.objects.filter(work_item_id=item_id)
        .annotate(attempt=Window(RowNumber(), order_by=F("id").asc()))
        .order_by("-id")
        .only(*_RUN_FIELDS)[:limit]
    )


def work_item_steps(
    runs: list[WorkflowRun], *, output: bool = False
) -> dict[str, list[WorkflowStepRun]]:
    """The step runs of `runs` by run id, in step order: one query however many runs;
    with their output tails when `output`."""
    steps: dict[str, list[WorkflowStepRun]] = {run.id: [] for run in runs}
    if not runs:
        return steps
    fields = (*_STEP_FIELDS, "stdout", "stderr") if output else _STEP_FIELDS
    for step in (
        WorkflowStepRun.objects.filter(workflow_run_id__in=list(steps))
        .order_by("workflow_run_id", "sequence", "id")
        .only(*fields)
    ):
        steps[step.workflow_run_id].append(step)
    return steps


def work_item_read(item: WorkflowWorkItem, *, output: bool = False) -> WorkItemRead:
    """What a work-item page shows of `item` (see the module docstring)."""
    runs = work_item_runs(item.id)
    steps = work_item_steps(runs, output=output)
    every = [step.id for run in runs for step in steps[run.id]]
    return WorkItemRead(
        item=item,
        runs=runs,
        steps=steps,
        attempts=step_attempts(every),
    )


def item_rounds(item_id: str) -> list[dict[str, Any]]:
    """The item's revisions, oldest first, as every surface shows them (the /ops/ item
    page, the run's admin page, `routes show`, the API): trigger, state, round, findings
    (untrusted: escaped where shown), sources, runs, why skipped, and the round run's
    accounts, tokens and cost. Two queries."""
    revisions = list(
        WorkItemRevision.objects.filter(work_item_id=item_id).order_by(
            "created_at", "id"
        )
    )
    run_ids = [r.run_id for r in revisions if r.run_id]
    spent: dict[str, dict[str, Any]] = {
        run_id: {"accounts": [], "tokens": 0, "costUsd": None} for run_id in run_ids
    }
    for run_id, account, tokens_in, tokens_out, cost in WorkflowStepRun.objects.filter(
        workflow_run_id__in=run_ids
    ).values_list(
        "workflow_run_id",
        "account_profile",
        "usage_input_tokens",
        "usage_output_tokens",
        "usage_cost_usd",
    ):
        entry = spent[run_id]
        if account and account not in entry["accounts"]:
            entry["accounts"].append(account)
        entry["tokens"] += (tokens_in or 0) + (tokens_out or 0)
        if cost is not None:
            entry["costUsd"] = (entry["costUsd"] or 0.0) + cost
    return [
        {
            "id": r.id,
            "round": r.round,
            "trigger": r.trigger,
            "state": r.state,
            "started": r.state == RevisionState.STARTED,
            "findings": r.findings,
            "sources": (r.details or {}).get("sources") or [],
            "baseRunId": r.base_run_id,
            "runId": r.run_id,
            "dueAt": r.due_at.isoformat(),
            "createdAt": r.created_at.isoformat(),
            "reason": r.reason,
            **spent.get(r.run_id or "", {"accounts": [], "tokens": 0, "costUsd": None}),
        }
        for r in revisions
    ]
