"""Pruning per-run git worktrees (runs/worktrees.py, "pruning"), the periodic task's and
`manage.py prune_worktrees`' work. A prune never loses work:

- `worktrees_prune`: worktrees of succeeded runs whose removal did not happen (5 minutes
  after their end, `SUCCEEDED_GRACE_SECONDS`: the runner removes its own just after), and of
  failed, timed-out or cancelled runs LOOPSWEB_WORKTREE_KEEP_SECONDS after they finished
  (kept that long for an operator). Only this host's worktrees (LOOPSWEB_HOST_NAME). What
  a worktree still holds uncommitted (a run whose worker was killed mid-step, whose
  recovery could not commit it here) is committed on the run's branch first
  (runs.run_worktree.save_left_work); when that cannot be done the run records why and
  the worktree is kept (`kept`), never pruned: it is the only copy. A dry run lists what
  would be committed first.
- `worktree_orphans_prune`: directories under LOOPSWEB_WORKTREE_DIR the ledger does not
  keep (named after no run, or after an ended run whose worktree is recorded removed). One
  goes only when it provably holds no uncommitted work: empty, or a git worktree of a
  project inside the roots whose files are the commit its HEAD names. Anything else (a
  worktree an agent renamed with its work in it, a directory that is no readable worktree)
  is kept and reported (`kept`) for an operator to look at.

Each removal goes through `runs.worktrees.worktree_remove` and is recorded on its run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from ledger import services
from ledger.models import TERMINAL_RUN_STATUSES, RunStatus, WorkflowRun
from runs.git import GitError, resolve_commit
from runs.projects import project_roots
from runs.run_worktree import on_this_disk, save_left_work
from runs.worktrees import (
    WorktreeError,
    dot_git_file,
    project_repository,
    tree_changes,
    worktree_base,
    worktree_branch,
    worktree_project,
    worktree_remove,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrunedWorktree:
    run_id: str
    status: str
    path: str
    branch: str | None
    error: str | None = None
    kept: str | None = None  # why it stays: it holds work that is not committed
    committed: int = 0  # paths left uncommitted, committed on the branch before removal

    @property
    def removed(self) -> bool:
        """Removed (or, in a dry run, to be removed)."""
        return self.error is None and self.kept is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "status": self.status,
            "path": self.path,
            "branch": self.branch,
            "error": self.error,
            "kept": self.kept,
            "committed": self.committed,
        }


# How long after its end a succeeded run's worktree is left to its runner's own removal.
SUCCEEDED_GRACE_SECONDS = 300


def worktrees_due(*, now: datetime, keep_seconds: int) -> Any:
    """This host's runs whose worktree should go now (module docstring, "pruning"), oldest first.

    Only worktrees recorded on this host (LOOPSWEB_HOST_NAME): another machine's directory
    is not on this disk, and marking it removed from here would lose it. A worktree with no
    host recorded (made before hosts were recorded) is this host's when its directory is
    here (checked in worktrees_prune)."""
    kept_until = now - timedelta(seconds=keep_seconds)
    # A succeeded run's runner removes its worktree just after recording the end: one
    # whose removal is not recorded a while later is one where it did not happen (a
    # prune at once would race the runner's own removal).
    removal_missed = now - timedelta(seconds=SUCCEEDED_GRACE_SECONDS)
    return (
        WorkflowRun.objects.filter(
            worktree_path__isnull=False,
            worktree_removed_at__isnull=True,
            status__in=TERMINAL_RUN_STATUSES,
            commit_error__isnull=True,
        )
        .filter(
            Q(worktree_host=settings.LOOPSWEB_HOST_NAME) | Q(worktree_host__isnull=True)
        )
        .filter(
            Q(status=RunStatus.SUCCEEDED, finished_at__lte=removal_missed)
            | Q(finished_at__lte=kept_until)
        )
        .select_related("workflow")
        .order_by("finished_at", "id")
    )


def worktrees_prune(
    *,
    now: datetime | None = None,
    keep_seconds: int | None = None,
    dry_run: bool = False,
) -> list[PrunedWorktree]:
    """Remove the worktrees that are due; each removal is recorded on its run.

    A removal that fails is reported with its error and tried again at the next prune.
    """
    now = now or timezone.now()
    keep = (
        settings.LOOPSWEB_WORKTREE_KEEP_SECONDS
        if keep_seconds is None
        else keep_seconds
    )
    pruned: list[PrunedWorktree] = []
    for run in worktrees_due(now=now, keep_seconds=keep):
        assert run.worktree_path is not None
        if not on_this_disk(run):
            continue  # not recorded on a host and not on this disk: not ours to mark
        left = save_left_work(run, why="before its prune", dry_run=dry_run)
        error = None
        if left.kept is None and not dry_run:
            error = _remove_due(run)
        pruned.append(
            PrunedWorktree(
                run_id=run.id,
                status=run.status,
                path=run.worktree_path,
                branch=run.worktree_branch,
                error=error,
                kept=left.kept,
                committed=len(left.paths),
            )
        )
    return pruned


def _remove_due(run: WorkflowRun) -> str | None:
    """Remove a due worktree and record it on its run; the error, or None."""
    assert run.worktree_path is not None
    found = worktree_project(run.workflow.steps_json or [])
    try:
        worktree_remove(
            project=found[0] if found else None,
            path=run.worktree_path,
            branch=run.worktree_branch,
        )
        services.run_worktree_removed(run_id=run.id)
    except (WorktreeError, OSError) as exc:
        logger.warning("could not prune worktree of run %s: %s", run.id, exc)
        return str(exc)
    return None


def _orphan_repository(path: Path) -> tuple[str, str] | None:
    """(the project, the worktree's git dir) of a leftover worktree directory (its `.git`
    file names the repository's `.git/worktrees/<name>`) when that lies inside the project
    roots, or None (the file is the agent's to write)."""
    text = dot_git_file(path)
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(os.path.realpath(text.removeprefix("gitdir:").strip()))
    if gitdir.parent.name != "worktrees" or gitdir.parent.parent.name != ".git":
        return None
    repo = gitdir.parent.parent.parent
    if not any(repo.is_relative_to(root) for root in project_roots()):
        return None
    return (str(repo), str(gitdir)) if repo.is_dir() else None


ORPHAN_UNKNOWN = (
    "not a git worktree of a project inside LOOPSWEB_PROJECT_ROOTS: what it holds cannot "
    "be checked, so it stays (look at it, then remove it by hand)"
)
ORPHAN_NO_HEAD = "its HEAD names no commit of {project}: it stays (look at it)"
ORPHAN_CHANGED = (
    "holds {count} path(s) not committed ({first}): it stays (an agent may have moved "
    "its worktree here)"
)


def _orphan_kept(path: Path, found: tuple[str, str] | None) -> str | None:
    """Why the orphan directory `path` must stay, or None when it holds no uncommitted
    work (module docstring)."""
    try:
        if path.is_symlink() or not any(path.iterdir()):
            return None  # a link (removed, never followed) or an empty directory
    except OSError as exc:
        return f"cannot be read ({exc}): it stays"
    if found is None:
        return ORPHAN_UNKNOWN
    project, gitdir = found
    try:
        common = project_repository(project).common_dir
        head = resolve_commit(gitdir, "HEAD") if os.path.isdir(gitdir) else None
        if head is None:
            return ORPHAN_NO_HEAD.format(project=project)
        changed = tree_changes(common, str(path), head)
    except (WorktreeError, GitError) as exc:
        return f"{exc}: it stays"
    if changed:
        return ORPHAN_CHANGED.format(count=len(changed), first=", ".join(changed[:3]))
    return None


def worktree_orphans_prune(*, dry_run: bool = False) -> list[PrunedWorktree]:
    """Remove worktree directories on this disk the ledger does not keep: named after no
    run, or after a run that ended whose worktree is recorded removed (or never recorded)
    and that is not another host's; one that may hold work is kept (module docstring).
    Each goes with its branch (`git branch -d`: a branch with unmerged commits stays),
    through `worktree_remove`."""
    base = worktree_base()
    try:
        names = [entry.name for entry in os.scandir(base) if entry.is_dir()]
    except OSError:
        return []
    runs = {
        row["id"]: row
        for row in WorkflowRun.objects.filter(id__in=names).values(
            "id", "status", "worktree_path", "worktree_removed_at", "worktree_host"
        )
    }
    me = settings.LOOPSWEB_HOST_NAME
    pruned: list[PrunedWorktree] = []
    for name in sorted(names):
        run = runs.get(name)
        if run is not None:
            if run["status"] not in TERMINAL_RUN_STATUSES:
                continue  # a live run's worktree (or about to be)
            if run["worktree_host"] not in (None, me):
                continue  # recorded on another host: a shared directory, not ours
            if run["worktree_path"] and run["worktree_removed_at"] is None:
                continue  # kept for an operator; worktrees_prune removes it when due
        path = base / name
        found = _orphan_repository(path)
        kept = _orphan_kept(path, found)
        error = None
        if kept is not None:
            logger.warning("orphan worktree %s kept: %s", path, kept)
        elif not dry_run:
            try:
                worktree_remove(
                    project=found[0] if found else None,
                    path=str(path),
                    branch=worktree_branch(name),
                )
                if run is not None and run["worktree_path"]:
                    services.run_worktree_removed(run_id=name)
            except (WorktreeError, OSError) as exc:
                logger.warning("could not remove orphan worktree %s: %s", path, exc)
                error = str(exc)
        pruned.append(
            PrunedWorktree(
                run_id=name,
                status=run["status"] if run else "orphan",
                path=str(path),
                branch=worktree_branch(name),
                error=error,
                kept=kept,
            )
        )
    return pruned
