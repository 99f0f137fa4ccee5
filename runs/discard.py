"""Branches cleaned up (docs/delivery.md §5).

- `discard_run_work` ("Discard": the item page, the run's admin page, `manage.py
  discard_run RUN`): an ended run's kept worktree is removed, its branch
  `loopsweb/run-<id>` deleted in the project and the run marked `work_discarded_at` (event
  `work_discarded`). What was pushed to a remote stays there (a pull request is the
  forge's to close).
- `run_branches_prune` (the periodic `prune-worktrees` task and `manage.py
  prune_worktrees`): also deletes the branches of ended runs that changed nothing, and of
  delivered runs whose pull request is merged or closed, once they ended more than
  LOOPSWEB_BRANCH_KEEP_SECONDS ago (the pull request's state is asked of the forge).

Only a ref named `refs/heads/loopsweb/run-<the run's id>` is ever deleted, and only when it
still points at the commit git read a moment before (`update-ref -d REF OLD`).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from domain.errors import ApplicationError, ValidationError
from ledger.models import TERMINAL_RUN_STATUSES, WorkflowRun
from ledger.services.common import NotFound
from ledger.services.delivery import run_pull_request_state, run_work_discarded
from runs.delivery_view import run_project
from runs.git import GitError, resolve_commit, run_git
from runs.github import ForgeError, get_pull_request
from runs.worktrees import (
    WorktreeError,
    project_repository,
    worktree_branch,
    worktree_remove,
)

logger = logging.getLogger(__name__)

RUN_NOT_FOUND = "run not found: {run_id}"
NOT_ENDED = "run {run_id} has not ended ({status}): cancel it first"
ALREADY_DISCARDED = "the work of run {run_id} was discarded already"
_RUN_BRANCH = re.compile(r"^loopsweb/run-[0-9a-f]{32}$")


@dataclass(frozen=True)
class Discarded:
    run_id: str
    branch: str | None
    deleted: bool  # the branch was there and is gone now
    worktree_removed: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "branch": self.branch,
            "deleted": self.deleted,
            "worktreeRemoved": self.worktree_removed,
            "reason": self.reason,
        }


def _delete_branch(run: WorkflowRun) -> bool:
    """Delete the run's own branch (only `loopsweb/run-<its id>`); whether it was there."""
    branch = run.worktree_branch
    if branch != worktree_branch(run.id) or not _RUN_BRANCH.match(branch):
        return False  # never a branch that is not the run's
    project = run_project(run)
    if project is None or not os.path.isdir(project):
        return False
    common = project_repository(project).common_dir
    ref = f"refs/heads/{branch}"
    head = resolve_commit(common, ref)
    if head is None:
        return False
    run_git("update-ref", "-d", ref, head, git_dir=common, cwd=common)
    return True


def discard_run_work(run_id: str, *, reason: str = "discarded") -> Discarded:
    """Discard an ended run's work (module docstring); NotFound / ValidationError."""
    run = WorkflowRun.objects.select_related("workflow").filter(pk=run_id).first()
    if run is None:
        raise NotFound(RUN_NOT_FOUND.format(run_id=run_id))
    if run.status not in TERMINAL_RUN_STATUSES:
        raise ValidationError(NOT_ENDED.format(run_id=run.id, status=run.status))
    if run.work_discarded_at is not None:
        raise ValidationError(ALREADY_DISCARDED.format(run_id=run.id))
    removed = False
    try:
        if run.worktree_path and run.worktree_removed_at is None:
            worktree_remove(
                project=run_project(run), path=run.worktree_path, branch=None
            )
            removed = True
        deleted = _delete_branch(run)
    except (WorktreeError, GitError, OSError) as exc:
        raise ValidationError(f"discard of run {run.id} failed: {exc}") from None
    run_work_discarded(
        run,
        worktree_removed=removed,
        branch_deleted=deleted,
        reason=reason,
        now=timezone.now(),
    )
    return Discarded(run.id, run.worktree_branch, deleted, removed, reason)


def _pr_closed(run: WorkflowRun) -> str | None:
    """`merged` or `closed` when the run's pull request is (asked of the forge), else None."""
    pr = (run.delivery_json or {}).get("pr")
    if not isinstance(pr, dict) or not isinstance(pr.get("number"), int):
        return None
    try:
        found = get_pull_request(str(pr.get("repo")), pr["number"])
    except ForgeError as exc:
        logger.warning("run %s: pull request state unknown: %s", run.id, exc)
        return None
    run_pull_request_state(run, found.state)
    return found.state if found.state in ("merged", "closed") else None


def run_branches_prune(
    *, now: datetime | None = None, dry_run: bool = False
) -> list[Discarded]:
    """Delete the branches that are due (module docstring); each recorded on its run."""
    now = now or timezone.now()
    ended_before = now - timedelta(seconds=settings.LOOPSWEB_BRANCH_KEEP_SECONDS)
    runs = (
        WorkflowRun.objects.filter(
            status__in=TERMINAL_RUN_STATUSES,
            worktree_branch__isnull=False,
            work_discarded_at__isnull=True,
            commit_error__isnull=True,
            finished_at__lte=ended_before,
        )
        .filter(Q(commit_diffstat="") | Q(delivery_json__has_key="pr"))
        .filter(Q(worktree_path__isnull=True) | Q(worktree_removed_at__isnull=False))
        .select_related("workflow")
        .order_by("finished_at", "id")
    )
    done: list[Discarded] = []
    for run in runs:
        why = "no changes" if run.commit_diffstat == "" else _pr_closed(run)
        if why is None:
            continue
        reason = why if why == "no changes" else f"pull request {why}"
        if dry_run:
            done.append(Discarded(run.id, run.worktree_branch, False, False, reason))
            continue
        try:
            done.append(discard_run_work(run.id, reason=reason))
        except ApplicationError as exc:
            logger.warning("could not prune the branch of run %s: %s", run.id, exc)
    return done
