"""Pruning per-run git worktrees (ledger.worktrees, its docstring's point 3), the periodic
task's and `manage.py prune_worktrees`' work:

- `worktrees_prune`: worktrees of succeeded runs whose removal did not happen, and of
  failed, timed-out or cancelled runs LOOPSWEB_WORKTREE_KEEP_SECONDS after they finished
  (kept that long for an operator). A worktree whose work could not be committed is never
  pruned: it is the only copy. Only this host's worktrees (LOOPSWEB_HOST_NAME).
- `worktree_orphans_prune`: directories under LOOPSWEB_WORKTREE_DIR the ledger does not
  keep (named after no run, or after an ended run whose worktree is recorded removed).

Each removal goes through `ledger.worktrees.worktree_remove` and is recorded on its run.
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
from ledger.projects import project_roots
from ledger.worktrees import (
    WorktreeError,
    dot_git_file,
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "status": self.status,
            "path": self.path,
            "branch": self.branch,
            "error": self.error,
        }


def worktrees_due(*, now: datetime, keep_seconds: int) -> Any:
    """This host's runs whose worktree should go now (module docstring, 3), oldest first.

    Only worktrees recorded on this host (LOOPSWEB_HOST_NAME): another machine's directory
    is not on this disk, and marking it removed from here would lose it. A worktree with no
    host recorded (made before hosts were recorded) is this host's when its directory is
    here (checked in worktrees_prune)."""
    kept_until = now - timedelta(seconds=keep_seconds)
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
        .filter(Q(status=RunStatus.SUCCEEDED) | Q(finished_at__lte=kept_until))
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
        if run.worktree_host is None and not os.path.lexists(run.worktree_path):
            continue  # not recorded on a host and not on this disk: not ours to mark
        found = worktree_project(run.workflow.steps_json or [])
        error = None
        if not dry_run:
            try:
                worktree_remove(
                    project=found[0] if found else None,
                    path=run.worktree_path,
                    branch=run.worktree_branch,
                )
                services.run_worktree_removed(run_id=run.id)
            except (WorktreeError, OSError) as exc:
                logger.warning("could not prune worktree of run %s: %s", run.id, exc)
                error = str(exc)
        pruned.append(
            PrunedWorktree(
                run_id=run.id,
                status=run.status,
                path=run.worktree_path,
                branch=run.worktree_branch,
                error=error,
            )
        )
    return pruned


def _orphan_repository(path: Path) -> str | None:
    """The project a leftover worktree directory belongs to (its `.git` file names the
    repository's `.git/worktrees/<name>`) when that lies inside the project roots, or None
    (then only the directory is removed: the file is the agent's to write)."""
    text = dot_git_file(path)
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(os.path.realpath(text.removeprefix("gitdir:").strip()))
    if gitdir.parent.name != "worktrees" or gitdir.parent.parent.name != ".git":
        return None
    repo = gitdir.parent.parent.parent
    if not any(repo.is_relative_to(root) for root in project_roots()):
        return None
    return str(repo) if repo.is_dir() else None


def worktree_orphans_prune(*, dry_run: bool = False) -> list[PrunedWorktree]:
    """Remove worktree directories on this disk the ledger does not keep: named after no
    run, or after a run that ended whose worktree is recorded removed (or never recorded)
    and that is not another host's. Each goes with its branch (`git branch -d`: a branch
    with unmerged commits stays), through `worktree_remove`."""
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
        repo = _orphan_repository(path)
        error = None
        if not dry_run:
            try:
                worktree_remove(
                    project=repo, path=str(path), branch=worktree_branch(name)
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
            )
        )
    return pruned
