"""Plain-text summaries of ledger rows shared by the admin and the /ops pages."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings

from ledger.models import RunStatus, WorkflowRun


def worktree_text(run: WorkflowRun) -> str:
    """Where a run worked: its git worktree and branch, and what became of the worktree.

    `-` for a run that had none (worktree mode off, or the project is not a git work tree).
    """
    if not run.worktree_path:
        return "-"
    branch = f" on branch {run.worktree_branch}" if run.worktree_branch else ""
    if run.worktree_removed_at is not None:
        state = f"removed {run.worktree_removed_at:%Y-%m-%d %H:%M} UTC"
    elif run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
        state = "in use"
    elif run.status == RunStatus.SUCCEEDED or run.finished_at is None:
        state = "to be removed"
    else:
        until = run.finished_at + timedelta(
            seconds=settings.LOOPSWEB_WORKTREE_KEEP_SECONDS
        )
        state = f"kept until {until:%Y-%m-%d %H:%M} UTC"
    return f"{run.worktree_path}{branch} ({state})"


NO_CHANGES = "no changes: the run left the project as it was"


def commit_text(run: WorkflowRun) -> str:
    """What a run left on its branch (ledger.worktrees.worktree_commit): the branch, its
    head, the diffstat's summary line and the command that checks it out; why the work was
    not committed and where it is kept, when it was not; `-` before the run ended or when it
    had no worktree."""
    if run.worktree_path and run.commit_error:
        return run.commit_error
    if not run.worktree_path or run.commit_head is None:
        return "-"
    if not run.commit_diffstat:
        return NO_CHANGES
    lines = run.commit_diffstat.strip().splitlines()
    summary = lines[-1].strip() if lines else ""
    return (
        f"branch {run.worktree_branch} at {run.commit_head[:12]} ({summary}); "
        f"check it out in the project: git switch {run.worktree_branch}"
    )


def seconds(ms: int | None) -> str:
    """A duration in milliseconds as seconds and minutes: `12.3 s`, `12 min 34 s`,
    `2 h 5 min` (blank when unknown)."""
    if ms is None:
        return ""
    value = ms / 1000
    if value < 100:
        return f"{value:.1f} s"
    whole = int(round(value))
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(whole, 3600)
    return f"{hours} h {rest // 60} min" if rest // 60 else f"{hours} h"
