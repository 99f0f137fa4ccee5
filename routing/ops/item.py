"""What the /ops item page shows of a work item's runs (routing.ops.views.work_item): each
step with its attempts (one line: `worker: cx-a → rate limited after 0.6 s → cx-b,
succeeded in 1.4 s`), its tokens and cost, its error, and for a running step the last
lines it printed; each run's and the item's tokens and cost; the inbox events' state as it
follows the item.

Queries: those of the item's read (ledger.item_read.work_item_read, the admin's page reads
the same), and the output of the running steps in one, only when a step runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from agents.agent_output import summarize_output
from ledger.display import UsageSum, attempts_story, step_usage
from ledger.item_read import WorkItemRead
from ledger.models import (
    TERMINAL_RUN_STATUSES,
    StepStatus,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkItemStatus,
)
from routing.models import InboxState
from routing.ops.display import visible_controls
from runs.delivery import redeliverable
from runs.delivery_view import (
    Patch,
    delivery_line,
    pull_request,
    run_commits,
    run_patch,
)

# The last lines of a running step's output the page shows (docs/operations.md: "the last few").
LIVE_LINES = 12
# An item that ended so: its admitted inbox events read as the item does.
ENDED_ITEM_STATES = (
    WorkItemStatus.FAILED,
    WorkItemStatus.CANCELLED,
    WorkItemStatus.DEAD_LETTER,
    WorkItemStatus.SUCCEEDED,
)


@dataclass
class StepView:
    step: WorkflowStepRun
    attempts: list[WorkflowStepAttempt]
    story: str
    usage: UsageSum
    live: str = ""  # a running step's last readable lines


@dataclass
class RunView:
    run: WorkflowRun
    steps: list[StepView] = field(default_factory=list)
    usage: UsageSum = field(default_factory=UsageSum)
    # The run's work (runs.delivery_view): commits, delivery, patch, actions.
    commits: list[dict[str, Any]] = field(default_factory=list)
    delivery: str | None = None
    pr: dict[str, Any] | None = None
    patch: Patch | None = None
    can_redeliver: bool = False
    can_discard: bool = False


def shown_patch(patch: Patch | None) -> Patch | None:
    """The patch as the page shows it: its control characters as visible pictures
    (routing.ops.display.visible_controls), never sent to the browser as they are."""
    if patch is None:
        return None
    return replace(patch, text=visible_controls(patch.text))


def work_view(view: RunView, steps: list[WorkflowStepRun]) -> None:
    """Fill in what the run left (its branch, commits, delivery, patch) on `view`."""
    run = view.run
    view.commits = run_commits(run, steps)
    view.delivery = delivery_line(run)
    view.pr = pull_request(run)
    if run.status in TERMINAL_RUN_STATUSES and run.worktree_branch:
        view.patch = shown_patch(run_patch(run))
        view.can_redeliver = redeliverable(run)
        view.can_discard = run.work_discarded_at is None


def live_output(
    steps: Sequence[WorkflowStepRun], *, lines: int = LIVE_LINES
) -> dict[str, str]:
    """The last readable lines (one per agent event for the JSON-speaking CLIs) of each
    running step, by step run id: one query, none when no step runs."""
    running = [s.id for s in steps if s.status == StepStatus.RUNNING]
    if not running:
        return {}
    found: dict[str, str] = {}
    for step_id, tool, stdout, stderr in WorkflowStepRun.objects.filter(
        pk__in=running
    ).values_list("id", "account_tool", "stdout", "stderr"):
        text = summarize_output(tool, stdout or "").splitlines()
        if not text:
            text = (stderr or "").splitlines()
        found[step_id] = "\n".join(text[-lines:])
    return found


def run_views(read: WorkItemRead, *, now: datetime) -> tuple[list[RunView], UsageSum]:
    """Each run of the item's read (ledger.item_read) with its steps as the page shows
    them, and the item's total usage."""
    live = live_output(read.every_step())
    views = []
    total = UsageSum()
    for run in read.runs:
        view = RunView(run=run)
        for step in read.steps.get(run.id, []):
            tries = read.attempts.get(step.id, [])
            usage = step_usage(step, tries)
            view.steps.append(
                StepView(
                    step=step,
                    attempts=tries,
                    story=attempts_story(step.step_id, tries, now),
                    usage=usage,
                    live=live.get(step.id, ""),
                )
            )
            view.usage = view.usage + usage
        work_view(view, read.steps.get(run.id, []))
        total = total + view.usage
        views.append(view)
    return views, total


def inbox_state(state: str, item_status: str) -> str:
    """An inbox event's state as the item page reads it: an admitted event of an item that
    ended reads as the item did (`admitted → failed`); the row itself keeps `admitted`, the
    state a drain and the inbox actions go by."""
    if state == InboxState.ADMITTED and item_status in ENDED_ITEM_STATES:
        return f"{state} → {item_status}"
    return state
