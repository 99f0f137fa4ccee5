"""Per-run git worktrees: every step of a run works in its own checkout of the project.

1. `worktree_create`: `git worktree add -b loopsweb/run-<run id> <dir>/<run id> HEAD` from
   the project, under LOOPSWEB_WORKTREE_DIR (default `<data dir>/worktrees`, mode 0700).
   A failure raises WorktreeError (`worktree preparation failed: ...`, upstream's wording)
   after removing whatever the attempt made: the directory, git's record of it, the branch.
   An existing directory or branch of that name is an error and is never touched.
2. `worktree_remove`: `git worktree remove --force`, then `git branch -d`, which keeps a
   branch that carries commits not merged into the project's HEAD (the agent's work is not
   thrown away with its checkout). Without the project, the directory is deleted directly.
2b. `worktree_commit`: at the end of every run in a worktree (before it is removed or kept
   for pruning), what the agent left uncommitted is committed on the run's branch (author
   loopsweb, a message naming the run, the item and the step), so removing the worktree
   never throws work away; it returns the branch, its head and the diffstat against the
   commit the run started from (empty: the run changed nothing).
3. `worktrees_prune` (the periodic task and `manage.py prune_worktrees`): worktrees of
   succeeded runs whose removal did not happen, and of failed, timed-out or cancelled runs
   LOOPSWEB_WORKTREE_KEEP_SECONDS after they finished (kept that long for an operator).

git runs with `-c core.hooksPath=/dev/null` (no project hook runs in the worker), an
environment of PATH, HOME and `LC_ALL=C`, no terminal prompt, and a timeout. Adding and
removing hold an exclusive lock on `<dir>/.lock`, so concurrent runs of one project never
race on the repository's worktree records.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from domain.errors import ApplicationError
from domain.sandbox import WORKTREE_AUTO, WORKTREE_REQUIRED
from ledger import services
from ledger.models import TERMINAL_RUN_STATUSES, RunStatus, WorkflowRun

logger = logging.getLogger(__name__)

WORKTREE_FAILED = "worktree preparation failed: {error}"
WORKTREE_EXISTS = "{path} already exists"
BRANCH_EXISTS = "branch {branch} already exists in {project}"
OUTSIDE_WORKTREE_DIR = "{path} is not inside LOOPSWEB_WORKTREE_DIR"
GIT_TIMEOUT_SECONDS = 120


class WorktreeError(ApplicationError):
    """A worktree could not be made or removed."""


@dataclass(frozen=True)
class Worktree:
    project: str
    path: str
    branch: str

    def translate(self, cwd: str) -> str:
        """`cwd` inside the project, as the same place inside this worktree (else as is)."""
        real = Path(os.path.realpath(cwd))
        if not real.is_relative_to(self.project):
            return cwd
        return str(Path(self.path) / real.relative_to(self.project))


def worktree_base() -> Path:
    return Path(settings.LOOPSWEB_WORKTREE_DIR)


def worktree_branch(run_id: str) -> str:
    return f"loopsweb/run-{run_id}"


def worktree_dir(run_id: str) -> Path:
    return worktree_base() / run_id


def worktree_project(steps: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(project, mode) of a run whose agent steps ask for a worktree, else None.

    Generated route workflows give every agent step the same `cwd` (the project) and
    `worktreeMode`; `required` on any step makes the run's mode `required`.
    """
    wanted = [
        step["target"]
        for step in steps
        if isinstance(step.get("target"), dict)
        and step["target"].get("type") == "agent"
        and step["target"].get("worktreeMode") in (WORKTREE_AUTO, WORKTREE_REQUIRED)
        and isinstance(step["target"].get("cwd"), str)
    ]
    if not wanted:
        return None
    modes = {target["worktreeMode"] for target in wanted}
    mode = WORKTREE_REQUIRED if WORKTREE_REQUIRED in modes else WORKTREE_AUTO
    return wanted[0]["cwd"], mode


def _git_env() -> dict[str, str]:
    env = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    env.update(LC_ALL="C", GIT_TERMINAL_PROMPT="0")
    return env


def _git(project: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        settings.LOOPSWEB_GIT_BIN,
        "-C",
        project,
        "-c",
        "core.hooksPath=/dev/null",
        *args,
    ]
    try:
        return subprocess.run(
            argv,
            env=_git_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise WorktreeError(WORKTREE_FAILED.format(error=exc)) from None


def _git_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (result.stderr or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"git exited with code {result.returncode}"


def _branch_exists(project: str, branch: str) -> bool:
    result = _git(project, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
    return result.returncode == 0


@contextmanager
def _locked() -> Iterator[Path]:
    base = worktree_base()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(base / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield base
    finally:
        os.close(fd)  # closing releases the lock


def _discard(project: str, path: Path, branch: str | None) -> None:
    """Remove what a failed `worktree add` may have made (best effort, never raises)."""
    try:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        if os.path.isdir(project):
            _git(project, "worktree", "prune")
            if branch and _branch_exists(project, branch):
                _git(project, "branch", "-D", branch)
    except WorktreeError:
        logger.exception("could not clean up worktree %s", path)


def worktree_create(*, project: str, run_id: str) -> Worktree:
    """A new worktree of `project` (its HEAD) on a new branch named after the run."""
    path, branch = worktree_dir(run_id), worktree_branch(run_id)
    with _locked():
        if path.exists():
            raise WorktreeError(
                WORKTREE_FAILED.format(error=WORKTREE_EXISTS.format(path=path))
            )
        if _branch_exists(project, branch):
            raise WorktreeError(
                WORKTREE_FAILED.format(
                    error=BRANCH_EXISTS.format(branch=branch, project=project)
                )
            )
        try:
            result = _git(
                project, "worktree", "add", "--quiet", "-b", branch, str(path), "HEAD"
            )
            if result.returncode != 0:
                raise WorktreeError(WORKTREE_FAILED.format(error=_git_error(result)))
        except WorktreeError:
            # The branch did not exist before this attempt, so deleting it is ours to do.
            _discard(project, path, branch)
            raise
    return Worktree(project=project, path=str(path), branch=branch)


def worktree_remove(*, project: str | None, path: str, branch: str | None) -> None:
    """Delete a run's worktree and (when merged) its branch; see the module docstring."""
    target = Path(path)
    base = Path(os.path.realpath(worktree_base()))
    if not Path(os.path.realpath(target)).is_relative_to(base):
        raise WorktreeError(OUTSIDE_WORKTREE_DIR.format(path=path))
    with _locked():
        repo = project if project and os.path.isdir(project) else None
        if repo is not None and target.exists():
            _git(repo, "worktree", "remove", "--force", str(target))
        if target.exists():
            shutil.rmtree(target)
        if repo is not None:
            _git(repo, "worktree", "prune")
            if branch and _branch_exists(repo, branch):
                _git(repo, "branch", "-d", branch)


COMMIT_AUTHOR = "loopsweb"
COMMIT_EMAIL = "loopsweb@localhost"
COMMIT_MESSAGE = (
    "loopsweb run {run_id}: work left by step {step_id} of work item {item}"
)
DIFFSTAT_CHARS = 4000


@dataclass(frozen=True)
class WorktreeCommit:
    branch: str
    head: str
    diffstat: str  # "" when the run changed nothing
    committed: bool  # a commit was made for uncommitted changes


def _checked(result: subprocess.CompletedProcess[str]) -> str:
    if result.returncode != 0:
        raise WorktreeError(WORKTREE_FAILED.format(error=_git_error(result)))
    return result.stdout.strip()


def worktree_commit(worktree: Worktree, *, message: str) -> WorktreeCommit:
    """Commit everything the agent left in `worktree` (not ignored) on its branch."""
    path = worktree.path
    _checked(_git(path, "add", "--all"))
    staged = _git(path, "diff", "--cached", "--quiet")
    committed = staged.returncode == 1
    if committed:
        _checked(
            _git(
                path,
                "-c",
                f"user.name={COMMIT_AUTHOR}",
                "-c",
                f"user.email={COMMIT_EMAIL}",
                "-c",
                "commit.gpgsign=false",
                "commit",
                "--quiet",
                "--no-verify",
                "--author",
                f"{COMMIT_AUTHOR} <{COMMIT_EMAIL}>",
                "-m",
                message,
            )
        )
    elif staged.returncode != 0:
        _checked(staged)
    head = _checked(_git(path, "rev-parse", "HEAD"))
    # The fork point: where the project's HEAD was when the run's worktree was made.
    base = _checked(_git(worktree.project, "merge-base", "HEAD", head))
    stat = _checked(_git(path, "diff", "--stat", base, head)) if base != head else ""
    if len(stat) > DIFFSTAT_CHARS:
        stat = stat[: DIFFSTAT_CHARS - 1] + "…"
    return WorktreeCommit(
        branch=worktree.branch, head=head, diffstat=stat, committed=committed
    )


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
    """The repository a leftover worktree directory belongs to (its `.git` file names the
    repository's `.git/worktrees/<name>`), or None."""
    try:
        text = (path / ".git").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(text.removeprefix("gitdir:").strip())
    if gitdir.parent.name != "worktrees" or gitdir.parent.parent.name != ".git":
        return None
    repo = gitdir.parent.parent.parent
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
