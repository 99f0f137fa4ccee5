"""A run's worktree through its life (ledger.runner, module docstring 3): made or resumed
before the first step, the agents' work committed at the end, removed after success.

The commit may be refused (the worktree's `.git` no longer names the run's git dir) or fail;
then the worktree is kept on disk whatever the run's outcome, never pruned, and the run
records why and where the work is (`WorkflowRun.commit_error`, shown on `/ops/`, the run's
admin page and the API). docs/isolation.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DatabaseError

from domain.delivery import DELIVER_NONE
from domain.errors import ApplicationError
from domain.sandbox import WORKTREE_REQUIRED
from ledger import services
from ledger.dberrors import write_ledger
from ledger.delivery import deliver_run, delivery_start
from ledger.discard import discard_run_work
from ledger.models import RunStatus, WorkflowRun, WorkflowStepRun
from ledger.projects import WorktreeRequired, is_git_work_tree, project_dir_check
from ledger.step_commits import commit_step, step_commit_record
from ledger.worktrees import (
    COMMIT_MESSAGE,
    NOT_COMMITTED,
    Worktree,
    WorktreeError,
    worktree_branch,
    worktree_commit,
    worktree_create,
    worktree_dir,
    worktree_project,
    worktree_remove,
    worktree_resume,
)

logger = logging.getLogger(__name__)


def lost_work_branch(run: WorkflowRun) -> str | None:
    """The branch of the latest earlier run of `run`'s item that ended because its host was
    gone (ledger.services.hostloss), or None: a retry starts from the work that run had
    committed there when this machine's project has that branch (a project on storage
    both hosts see), else from the project's HEAD (ledger.worktrees.worktree_create)."""
    lost = (
        WorkflowRun.objects.filter(
            work_item_id=run.work_item_id,
            lost_with_host__isnull=False,
            worktree_branch__isnull=False,
        )
        .exclude(pk=run.pk)
        .order_by("-created_at")
        .values_list("id", "worktree_branch")
        .first()
    )
    # Only the branch loopsweb named after that run (never a name read as an option).
    if lost is None or lost[1] != worktree_branch(lost[0]):
        return None
    return lost[1]


class WorktreeLeaseLost(Exception):
    """The run stopped being this worker's while its worktree was being recorded."""


class RunWorktree:
    """The worktree of one run's execution in this worker (None: the run has none)."""

    def __init__(self, run: WorkflowRun, worker: str) -> None:
        self.run = run
        self.worker = worker
        self.worktree: Worktree | None = None
        self.saved = False  # the commit was tried (once per execution)
        self.kept = False  # the work is not committed: the worktree stays

    def prepare(self, specs: Sequence[Mapping[str, Any]]) -> Worktree | None:
        """The run's own worktree when its agent steps ask for one."""
        wanted = worktree_project(specs)
        if wanted is None:
            return None
        project = project_dir_check(wanted[0])
        if not is_git_work_tree(project):
            if wanted[1] == WORKTREE_REQUIRED:
                raise WorktreeRequired(project)
            return None  # auto: the project directory, under the provider's own sandbox
        run = self.run
        if run.worktree_path and run.worktree_branch:
            # A resumed run (handed back while a step waited): the worktree it already has.
            self.worktree = worktree_resume(
                project=project,
                path=run.worktree_path,
                branch=run.worktree_branch,
            )
            return self.worktree
        path, branch = str(worktree_dir(run.id)), worktree_branch(run.id)
        if not write_ledger(
            f"run {run.id}: its worktree",
            lambda: services.run_worktree_record(
                run_id=run.id, worker=self.worker, path=path, branch=branch
            ),
        ):
            raise WorktreeLeaseLost()
        try:
            self.worktree = worktree_create(
                project=project, run_id=run.id, start_from=lost_work_branch(run)
            )
        except WorktreeError:
            # Nothing was left behind (worktree_create cleaned up): forget the record too.
            services.run_worktree_record(
                run_id=run.id, worker=self.worker, path=None, branch=None
            )
            raise
        # Where the work would go, read before any agent step (ledger.delivery, 1).
        made = self.worktree
        self._record(lambda: delivery_start(run, made))
        return self.worktree

    def save(self, step_id: str | None) -> None:
        """Commit what the agents left on the run's branch and record its head and
        diffstat; once per execution. When that cannot be done, the worktree is kept and
        the run records why (module docstring)."""
        if self.worktree is None or self.saved:
            return
        self.saved = True
        run, worktree = self.run, self.worktree
        message = COMMIT_MESSAGE.format(
            run_id=run.id, step_id=step_id or "-", item=run.work_item_id or "-"
        )
        try:
            commit = worktree_commit(worktree, message=message)
        except (WorktreeError, OSError) as exc:
            self.kept = True
            reason = NOT_COMMITTED.format(reason=exc, path=worktree.path)
            logger.warning("run %s: %s", run.id, reason)
            self._record(
                lambda: services.run_commit_failed(run_id=run.id, error=reason)
            )
            return
        self._record(
            lambda: services.run_commit_record(
                run_id=run.id, head=commit.head, diffstat=commit.diffstat
            )
        )

    def commit_step(self, step: WorkflowStepRun) -> None:
        """Commit what `step` left on the run's branch, under its own name
        (ledger.step_commits); a commit that cannot be made keeps the worktree, as `save`."""
        if self.worktree is None or self.kept:
            return
        # The step as it ended (its account may have moved); read as a write is tried: the
        # database may be away when the step ends (ledger.dberrors).
        step_id = step.id
        step = (
            write_ledger(
                f"run {self.run.id}: the step {step.step_id} it commits",
                lambda: WorkflowStepRun.objects.filter(pk=step_id).first(),
            )
            or step
        )
        try:
            commit = commit_step(self.worktree, self.run, step)
        except (WorktreeError, OSError) as exc:
            self.kept = self.saved = True
            reason = NOT_COMMITTED.format(reason=exc, path=self.worktree.path)
            logger.warning("run %s: %s", self.run.id, reason)
            self._record(
                lambda: services.run_commit_failed(run_id=self.run.id, error=reason)
            )
            return
        if commit is not None:
            self._record(lambda: step_commit_record(step.id, commit))

    def _record(self, write: Any) -> None:
        try:
            write_ledger(f"run {self.run.id}: its commit", write)
        except DatabaseError:
            logger.exception("could not record the commit of run %s", self.run.id)

    def ended(self, status: str) -> None:
        """The run ended with `status`: deliver its work (ledger.delivery; a failure is
        recorded on the run, never raised), then remove the worktree after success."""
        record: dict[str, Any] = {}
        if self.worktree is not None and not self.kept:
            try:
                record = deliver_run(self.run.id)
            except Exception:
                logger.exception("could not deliver the work of run %s", self.run.id)
        if status == RunStatus.SUCCEEDED:
            self.remove()
            if record.get("mode") == DELIVER_NONE:  # nothing of the run is kept
                try:
                    discard_run_work(self.run.id, reason="--deliver none")
                except ApplicationError as exc:
                    logger.warning("run %s: %s", self.run.id, exc)

    def remove(self) -> None:
        """After success only, and only when the work is committed; a failed run's worktree
        is kept for the operator and pruned later (ledger.worktree_prune.worktrees_prune)."""
        if self.worktree is None or self.kept:
            return
        try:
            worktree_remove(
                project=self.worktree.project,
                path=self.worktree.path,
                branch=self.worktree.branch,
            )
            services.run_worktree_removed(run_id=self.run.id)
        except (WorktreeError, OSError):
            logger.exception("could not remove the worktree of run %s", self.run.id)
