"""A run's worktree through its life (runs/runner.py, "isolation"): made or resumed before
the first step, the agents' work committed at the end, removed after success.

The commit may be refused (the worktree's `.git` no longer names the run's git dir) or fail;
then the worktree is kept on disk whatever the run's outcome, never pruned, and the run
records why and where the work is (`WorkflowRun.commit_error`, shown on `/ops/`, the run's
admin page and the API). docs/isolation.md.

A run whose worker was killed never reaches its own commit: `save_left_work` makes it for
an ended run, on the run's branch, recorded on the run (event `work_saved`), or records why
it cannot (the worktree is then kept). Recovery calls it (`save_work_of_ended`: after a run
cluster's restart failed what its dead predecessor held, after lease recovery) for the
worktrees on this host, and the prune before it removes any worktree (runs.worktree_prune;
docs/operations.md, "Worktrees").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from domain.delivery import DELIVER_NONE
from domain.errors import ApplicationError
from domain.revisions import Verdict
from domain.sandbox import WORKTREE_REQUIRED
from ledger import services
from ledger.dberrors import write_ledger
from ledger.models import (
    TERMINAL_RUN_STATUSES,
    RunStatus,
    WorkflowRun,
    WorkflowStepRun,
)
from ledger.services.delivery import step_commit_record
from runs.delivery import deliver_run, delivery_start
from runs.discard import discard_run_work
from runs.projects import WorktreeRequired, is_git_work_tree, project_dir_check
from runs.revision_run import revisions_queue_waiting, verdict_after_run
from runs.step_commits import commit_step
from runs.worktrees import (
    COMMIT_MESSAGE,
    NOT_COMMITTED,
    Worktree,
    WorktreeError,
    worktree_branch,
    worktree_changes,
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
    both hosts see), else from the project's HEAD (runs.worktrees.worktree_create)."""
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
        # The branch a revision round continues (runs.revision_run), set before `prepare`.
        self.start_from: str | None = None

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
                project=project,
                run_id=run.id,
                start_from=self.start_from or lost_work_branch(run),
            )
        except WorktreeError:
            # Nothing was left behind (worktree_create cleaned up): forget the record too.
            services.run_worktree_record(
                run_id=run.id, worker=self.worker, path=None, branch=None
            )
            raise
        # Where the work would go, read before any agent step (runs/delivery.py, "the remote
        # is read before the agent runs").
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
        (runs.step_commits); a commit that cannot be made keeps the worktree, as `save`."""
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
            self._record(
                lambda: step_commit_record(
                    step.id, sha=commit.sha, diffstat=commit.diffstat
                )
            )

    def _record(self, write: Any) -> None:
        try:
            write_ledger(f"run {self.run.id}: its commit", write)
        except DatabaseError:
            logger.exception("could not record the commit of run %s", self.run.id)

    def ended(self, status: str, verdict: tuple[str, Verdict] | None = None) -> None:
        """The run ended with `status`: its verifier's `verdict` may hold the delivery
        (runs.revision_run); else deliver its work (runs.delivery; a failure is recorded
        on the run, never raised), then remove the worktree after success."""
        record: dict[str, Any] = {}
        held = None
        try:
            held = verdict_after_run(self.run, status, verdict)
        except (DatabaseError, ApplicationError):
            logger.exception("run %s: its verdict could not be acted on", self.run.id)
        if self.worktree is not None and not self.kept:
            try:
                record = deliver_run(self.run.id, held=held)
            except Exception:
                logger.exception("could not deliver the work of run %s", self.run.id)
        revisions_queue_waiting(self.run)
        if status == RunStatus.SUCCEEDED:
            self.remove()
            # Nothing of the run is kept, unless a revision continues its branch.
            if record.get("mode") == DELIVER_NONE and held is None:
                try:
                    discard_run_work(self.run.id, reason="--deliver none")
                except ApplicationError as exc:
                    logger.warning("run %s: %s", self.run.id, exc)

    def remove(self) -> None:
        """After success only, and only when the work is committed; a failed run's worktree
        is kept for the operator and pruned later (runs.worktree_prune.worktrees_prune)."""
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


LEFT_WORK_MESSAGE = (
    "loopsweb run {run_id}: work left uncommitted in its worktree, committed {why} "
    "(work item {item})"
)
NO_PROJECT = "the run names no project"
SAVED_AFTER_RECOVERY = "after recovery"


@dataclass(frozen=True)
class LeftWork:
    """What `save_left_work` found: the paths left uncommitted, the commit that holds them
    now (None: nothing to commit, or a dry run), or why the worktree must stay."""

    paths: list[str] = field(default_factory=list)
    head: str | None = None
    kept: str | None = None


def save_left_work(run: WorkflowRun, *, why: str, dry_run: bool = False) -> LeftWork:
    """Commit what the ended `run` left uncommitted in its worktree on this disk on the
    run's branch (runs.worktrees.worktree_commit) and record it (`run_work_saved`). When
    that cannot be done (tampered `.git`, a gone branch or project, a secret in the files)
    the run records why (`commit_error`: the worktree is kept, never pruned) and `kept`
    says so. `dry_run`: only what would be committed, nothing written. `run.workflow` read."""
    assert run.worktree_path is not None
    if not os.path.isdir(run.worktree_path) or os.path.islink(run.worktree_path):
        return (
            LeftWork()
        )  # no worktree on this disk (never made, or gone): nothing left
    found = worktree_project(run.workflow.steps_json or [])
    try:
        if found is None:
            raise WorktreeError(NO_PROJECT)
        worktree = worktree_resume(
            project=found[0],
            path=run.worktree_path,
            branch=run.worktree_branch or worktree_branch(run.id),
        )
        paths = worktree_changes(worktree)
        if not paths or dry_run:
            return LeftWork(paths=paths)
        message = LEFT_WORK_MESSAGE.format(
            run_id=run.id, why=why, item=run.work_item_id or "-"
        )
        commit = worktree_commit(worktree, message=message)
    except (WorktreeError, OSError) as exc:
        reason = NOT_COMMITTED.format(reason=exc, path=run.worktree_path)
        if not dry_run:
            logger.warning("run %s: %s", run.id, reason)
            services.run_commit_failed(run_id=run.id, error=reason)
        return LeftWork(kept=reason)
    services.run_work_saved(
        run_id=run.id, head=commit.head, diffstat=commit.diffstat, paths=paths, why=why
    )
    logger.warning(
        "run %s: %d path(s) left uncommitted, committed %s on %s as %s",
        run.id,
        len(paths),
        why,
        commit.branch,
        commit.head,
    )
    return LeftWork(paths=paths, head=commit.head)


def on_this_disk(run: WorkflowRun) -> bool:
    """Whether the run's kept worktree is this host's: recorded here, or (made before hosts
    were recorded) recorded on none and present on this disk."""
    if not run.worktree_path or run.worktree_removed_at is not None:
        return False
    if run.worktree_host is None:
        return os.path.lexists(run.worktree_path)
    return run.worktree_host == settings.LOOPSWEB_HOST_NAME


def save_work_of_ended(run_ids: Iterable[str]) -> list[LeftWork]:
    """After recovery ended `run_ids` (their processes killed): each one's work left in a
    worktree on this host committed on its branch (`save_left_work`). Never raises: a run
    whose work cannot be saved here keeps its worktree for the prune's own check."""
    saved = []
    runs = WorkflowRun.objects.filter(
        id__in=list(run_ids), commit_error__isnull=True
    ).select_related("workflow")
    for run in runs:
        if run.status not in TERMINAL_RUN_STATUSES or not on_this_disk(run):
            continue
        try:
            saved.append(save_left_work(run, why=SAVED_AFTER_RECOVERY))
        except Exception:  # a run cluster's start or the recovery task must go on
            logger.exception("could not save the left work of run %s", run.id)
    return saved
