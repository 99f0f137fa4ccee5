"""One commit per agent step that changed files (docs/delivery.md §1).

After each step of a run in a worktree, what the step left is committed on the run's branch
through the safe git path (runs.worktrees.worktree_commit: plumbing, no hook, no filter,
on the git dir loopsweb chose). The message names the task (its title and id), the step and
the run, with trailers a reviewer or a script can read:

    <task title> (task <id>): step <step>

(the title neutralized as a pull request's is, domain.forge_text: a "fixes #12" in a task's
title closes nothing when the branch merges)

    Work left by step <step> of loopsweb run <run> on work item <item>.

    Loopsweb-Run: <run id>
    Loopsweb-Step: <step id>
    Loopsweb-Account: <account, or ->
    Loopsweb-Provider: <provider, or ->

Author and committer are LOOPSWEB_GIT_AUTHOR. The step run records the commit and the
diffstat of that commit alone (`commit_sha`, `commit_diffstat`, written by
ledger.services.delivery.step_commit_record); a step that changed nothing records nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.forge_text import neutralize
from ledger.models import WorkflowRun, WorkflowStepRun
from runs.git import run_git
from runs.worktrees import DIFFSTAT_CHARS, Worktree, worktree_commit

SUBJECT_CHARS = 72
TRAILERS = (
    ("Loopsweb-Run", "run"),
    ("Loopsweb-Step", "step"),
    ("Loopsweb-Account", "account"),
    ("Loopsweb-Provider", "provider"),
)


@dataclass(frozen=True)
class StepCommit:
    sha: str
    parent: str
    diffstat: str


def one_line(text: object, limit: int) -> str:
    """`text` as one printable line of at most `limit` characters ("" for none)."""
    if not isinstance(text, str):
        return ""
    flat = " ".join(
        "".join(ch if ch.isprintable() else " " for ch in text).split()
    ).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def task_of(run: WorkflowRun) -> dict[str, str]:
    """The task (or event) the run works on, as its invocation recorded it: id, title and
    description ("" where unknown)."""
    invocation = run.invocation if run.invocation_id else None
    subject: Any = invocation.subject_json if invocation is not None else None
    subject = subject if isinstance(subject, dict) else {}
    raw = subject.get("raw") if isinstance(subject.get("raw"), dict) else {}
    title = raw.get("title") or _event_title(run) or raw.get("message")
    return {
        "id": str(subject.get("id") or run.work_item_id or run.id),
        "title": title if isinstance(title, str) else "",
        "description": str(raw.get("description") or ""),
    }


def _event_title(run: WorkflowRun) -> object:
    """The title in the routed event's data (a generic event's subject keeps its message)."""
    item = run.work_item if run.work_item_id else None
    route: Any = item.route_options_json if item is not None else None
    event = route.get("event") if isinstance(route, dict) else None
    data = event.get("data") if isinstance(event, dict) else None
    return data.get("title") if isinstance(data, dict) else None


def step_message(run: WorkflowRun, step: WorkflowStepRun) -> str:
    task = task_of(run)
    head = f" (task {one_line(task['id'], 60)}): step {one_line(step.step_id, 40)}"
    title = neutralize(one_line(task["title"], max(10, SUBJECT_CHARS - len(head))))
    title = title or "loopsweb"
    values = {
        "run": run.id,
        "step": one_line(step.step_id, 200),
        "account": one_line(step.account_profile, 200) or "-",
        "provider": one_line(step.account_tool, 100) or "-",
    }
    trailers = "\n".join(f"{name}: {values[key]}" for name, key in TRAILERS)
    return (
        f"{title}{head}\n\n"
        f"Work left by step {values['step']} of loopsweb run {run.id} on work item "
        f"{run.work_item_id or '-'}.\n\n{trailers}\n"
    )


def commit_step(
    worktree: Worktree, run: WorkflowRun, step: WorkflowStepRun
) -> StepCommit | None:
    """Commit what `step` left in the run's worktree; None when it changed nothing.
    WorktreeError as `worktree_commit` (then nothing is committed anywhere)."""
    made = worktree_commit(worktree, message=step_message(run, step))
    if not made.committed:
        return None
    common = worktree.common_dir
    parent = run_git("rev-parse", f"{made.head}^", git_dir=common, cwd=common).text
    stat_text = run_git(
        "diff", "--stat", "--no-color", parent, made.head, git_dir=common, cwd=common
    ).text
    if len(stat_text) > DIFFSTAT_CHARS:
        stat_text = stat_text[: DIFFSTAT_CHARS - 1] + "…"
    return StepCommit(sha=made.head, parent=parent, diffstat=stat_text)
