"""Per-run git worktrees: every step of a run works in its own checkout of the project.

The agent is untrusted and can write everything in its worktree, `.git` included, and the
repository's config a linked worktree shares; every git command here therefore goes
through runs.git (no discovery, no config that runs a program, no filter) on git dirs
loopsweb chose itself, never the ones the worktree names (docs/isolation.md).

1. `worktree_create`: the project's repository is resolved by git (`rev-parse`) and must
   lie inside LOOPSWEB_PROJECT_ROOTS (`project_repository`: a `.git` file may name one
   anywhere); then `git worktree add --no-checkout -b loopsweb/run-<run id> <dir>/<run id>
   HEAD` under LOOPSWEB_WORKTREE_DIR (default `<data dir>/worktrees`, mode 0700), the
   worktree's `.git` checked to name `<common dir>/worktrees/<run id>`, its files written
   by loopsweb (runs.worktree_files) and its index set (`read-tree`). A failure raises
   WorktreeError (`worktree preparation failed: ...`, upstream's wording) after removing
   whatever the attempt made. An existing directory or branch of that name is an error
   and is never touched.
2. `worktree_remove`: the directory is deleted (never following a symlink), `git worktree
   prune` forgets it, and the branch is deleted only when the project's HEAD contains it
   (as `git branch -d`: the agent's work is not thrown away with its checkout).
2b. `worktree_commit`: at the end of every run in a worktree, what the agent left is
   committed on the run's branch with plumbing (runs.worktree_files.snapshot_tree,
   `commit-tree`, `update-ref` from the branch's head): only `refs/heads/loopsweb/run-<id>`
   moves; the project's branches, index and files never change. When the worktree's `.git`
   no longer names the run's git dir, or the commit cannot be made, nothing is committed
   anywhere and WorktreeError says why (the runner keeps the worktree and records it).
   Returns the branch, its head and the diffstat against the commit the run started from
   (empty: the run changed nothing).
2c. `worktree_changes`: what `worktree_commit` would commit now (the paths changed since
   the branch's head), read without writing anything; `tree_changes` the same for any
   directory against a commit (an orphan's). Either raises WorktreeError when it cannot
   tell: whoever asks keeps the directory then.
3. **Pruning** (the periodic task and `manage.py prune_worktrees`) is runs.worktree_prune:
   worktrees of succeeded runs whose removal did not happen, and of failed, timed-out or
   cancelled runs LOOPSWEB_WORKTREE_KEEP_SECONDS after they finished; work left in one
   is committed on its branch before it goes (docs/operations.md, "Worktrees").

Adding and removing hold an exclusive lock on `<dir>/.lock`, so concurrent runs of one
project never race on the repository's worktree records.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from domain.delivery import parse_git_author
from domain.errors import ApplicationError
from domain.sandbox import WORKTREE_AUTO, WORKTREE_REQUIRED
from ledger.held_secrets import held_secrets
from runs.git import (
    GitError,
    GitResult,
    Repository,
    git_error_line,
    repository_at,
    resolve_commit,
    run_git,
)
from runs.projects import project_roots
from runs.worktree_files import (
    SecretInWork,
    changed_paths,
    checkout_files,
    snapshot_tree,
)

logger = logging.getLogger(__name__)

WORKTREE_FAILED = "worktree preparation failed: {error}"
WORKTREE_EXISTS = "{path} already exists"
BRANCH_EXISTS = "branch {branch} already exists in {project}"
OUTSIDE_WORKTREE_DIR = "{path} is not inside LOOPSWEB_WORKTREE_DIR"
REPOSITORY_OUTSIDE = (
    "project {path}: its git repository {git_dir} lies outside LOOPSWEB_PROJECT_ROOTS"
)
NO_COMMIT = "project {path} has no commit to start from (its HEAD names none)"
TAMPERED = "{path} no longer names the run's git dir {git_dir} (changed by the agent?)"
BRANCH_GONE = "the run's branch {branch} is gone"
COMMIT_FAILED = "the commit could not be made: {error}"
NOT_COMMITTED = "work not committed: {reason}; the agent's files are kept in {path}"
CHANGES_UNREADABLE = "cannot tell what {path} holds: {error}"


class WorktreeError(ApplicationError):
    """A worktree could not be made or removed."""


@dataclass(frozen=True)
class Worktree:
    project: str
    path: str
    branch: str
    common_dir: str  # the project repository's (runs.git.Repository), checked in roots

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


def project_repository(project: str) -> Repository:
    """The project's repository, as git resolves it, when its git dirs lie inside
    LOOPSWEB_PROJECT_ROOTS (a `.git` file may name a repository anywhere); else
    WorktreeError. Checked again each time a run's worktree is made or resumed."""
    try:
        repo = repository_at(project)
    except GitError as exc:
        raise WorktreeError(WORKTREE_FAILED.format(error=exc)) from None
    roots = project_roots()
    for where in (repo.git_dir, repo.common_dir):
        if not any(Path(where).is_relative_to(root) for root in roots):
            raise WorktreeError(
                WORKTREE_FAILED.format(
                    error=REPOSITORY_OUTSIDE.format(path=project, git_dir=where)
                )
            )
    return repo


def _admin_dir(common_dir: str, run_id: str) -> str:
    """git's record of the run's worktree: `<common dir>/worktrees/<run id>`."""
    return os.path.join(common_dir, "worktrees", run_id)


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


def _branch_head(common_dir: str, branch: str) -> str | None:
    return resolve_commit(common_dir, f"refs/heads/{branch}")


def _discard(common_dir: str, path: Path, branch: str | None, head: str | None) -> None:
    """Remove what a failed `worktree add` may have made (best effort, never raises)."""
    try:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        _git(common_dir, "worktree", "prune")
        if branch and head:
            _git(common_dir, "update-ref", "-d", f"refs/heads/{branch}", head)
    except WorktreeError:
        logger.exception("could not clean up worktree %s", path)


def _git(git_dir: str, *args: str) -> GitResult:
    """A git command on a repository directory of loopsweb's own choosing (runs.git)."""
    try:
        return run_git(*args, git_dir=git_dir, cwd=git_dir, check=False)
    except GitError as exc:
        raise WorktreeError(WORKTREE_FAILED.format(error=exc)) from None


def worktree_create(
    *, project: str, run_id: str, start_from: str | None = None
) -> Worktree:
    """A new worktree of `project` (its HEAD, or the head of the branch `start_from` when
    the project has it) on a new branch named after the run: git records it (`worktree add
    --no-checkout`), loopsweb writes its files (runs.worktree_files) and its index
    (`read-tree`)."""
    repo = project_repository(project)
    path, branch = worktree_dir(run_id), worktree_branch(run_id)
    head = _branch_head(repo.common_dir, start_from) if start_from else None
    head = head or resolve_commit(repo.git_dir, "HEAD")
    if head is None:
        raise WorktreeError(
            WORKTREE_FAILED.format(error=NO_COMMIT.format(path=project))
        )
    with _locked():
        if path.exists():
            raise WorktreeError(
                WORKTREE_FAILED.format(error=WORKTREE_EXISTS.format(path=path))
            )
        if _branch_head(repo.common_dir, branch) is not None:
            raise WorktreeError(
                WORKTREE_FAILED.format(
                    error=BRANCH_EXISTS.format(branch=branch, project=project)
                )
            )
        worktree = Worktree(
            project=project, path=str(path), branch=branch, common_dir=repo.common_dir
        )
        try:
            added = _git(
                repo.common_dir,
                "worktree",
                "add",
                "--quiet",
                "--no-checkout",
                "-b",
                branch,
                str(path),
                head,
            )
            if added.returncode != 0:
                raise WorktreeError(WORKTREE_FAILED.format(error=git_error_line(added)))
            problem = worktree_tampered(worktree)
            if problem is not None:
                raise WorktreeError(WORKTREE_FAILED.format(error=problem))
            checkout_files(common_dir=repo.common_dir, rev=head, dest=str(path))
            _index_at(worktree, head)
        except (WorktreeError, GitError, OSError) as exc:
            # The branch did not exist before this attempt, so deleting it is ours to do.
            _discard(
                repo.common_dir, path, branch, _branch_head(repo.common_dir, branch)
            )
            if isinstance(exc, WorktreeError):
                raise
            raise WorktreeError(WORKTREE_FAILED.format(error=exc)) from None
    return worktree


def worktree_resume(*, project: str, path: str, branch: str) -> Worktree:
    """The worktree a resumed run already has, its repository checked again."""
    repo = project_repository(project)
    return Worktree(
        project=project, path=path, branch=branch, common_dir=repo.common_dir
    )


def worktree_tampered(worktree: Worktree) -> str | None:
    """Why the worktree's `.git` no longer names the git dir loopsweb made for the run
    (`<common dir>/worktrees/<run id>`), or None when it still does."""
    dot_git = os.path.join(worktree.path, ".git")
    admin = _admin_dir(worktree.common_dir, Path(worktree.path).name)
    text = dot_git_file(Path(worktree.path))
    named = text.removeprefix("gitdir:").strip() if text.startswith("gitdir:") else ""
    if not named or os.path.realpath(
        os.path.join(worktree.path, named)
    ) != os.path.realpath(admin):
        return TAMPERED.format(path=dot_git, git_dir=admin)
    return None


def dot_git_file(worktree: Path) -> str:
    """The text of the `.git` FILE at the top of `worktree`, read from one descriptor opened
    without following a symlink (the agent may have put anything there); "" for anything
    else: missing, a directory, a link, a FIFO, over 4 KiB."""
    try:
        fd = os.open(worktree / ".git", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 4096:
            return ""
        return os.read(fd, 4096).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _index_at(worktree: Worktree, commit: str, *, check: bool = True) -> None:
    """The worktree's own index as `commit` (`read-tree`, no file touched), so the agent's
    `git status` shows only what changed since."""
    admin = _admin_dir(worktree.common_dir, Path(worktree.path).name)
    run_git(
        "read-tree",
        commit,
        git_dir=worktree.common_dir,
        cwd=worktree.common_dir,
        extra_env={"GIT_INDEX_FILE": os.path.join(admin, "index")},
        check=check,
    )


def worktree_remove(*, project: str | None, path: str, branch: str | None) -> None:
    """Delete a run's worktree and (when merged) its branch; see the module docstring."""
    target = Path(path)
    base = Path(os.path.realpath(worktree_base()))
    if not Path(os.path.realpath(target)).is_relative_to(base):
        raise WorktreeError(OUTSIDE_WORKTREE_DIR.format(path=path))
    repo = None
    if project and os.path.isdir(project):
        try:
            repo = project_repository(project)
        except WorktreeError as exc:
            # The directory goes all the same; git's records of a repository outside the
            # roots are not loopsweb's to touch.
            logger.warning("removing %s without git: %s", path, exc)
    with _locked():
        if target.is_symlink():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        if repo is None:
            return
        _git(repo.common_dir, "worktree", "prune")
        head = _branch_head(repo.common_dir, branch) if branch else None
        project_head = resolve_commit(repo.git_dir, "HEAD")
        if branch and head and project_head:
            merged = _git(
                repo.common_dir, "merge-base", "--is-ancestor", head, project_head
            )
            if merged.returncode == 0:
                _git(repo.common_dir, "update-ref", "-d", f"refs/heads/{branch}", head)


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


def worktree_commit(worktree: Worktree, *, message: str) -> WorktreeCommit:
    """Commit everything the agent left in `worktree` (not ignored) on its branch, and only
    there (module docstring, `worktree_commit`). WorktreeError when the worktree's `.git`
    was tampered with or the commit cannot be made: then nothing is committed anywhere."""
    problem = worktree_tampered(worktree)
    if problem is not None:
        raise WorktreeError(problem)
    common = worktree.common_dir
    try:
        parent = _branch_head(common, worktree.branch)
        if parent is None:
            raise WorktreeError(BRANCH_GONE.format(branch=worktree.branch))
        with tempfile.TemporaryDirectory(prefix="loopsweb-commit-") as scratch:
            tree = snapshot_tree(
                common_dir=common,
                work_tree=worktree.path,
                parent=parent,
                scratch=Path(scratch),
                forbidden=held_secrets(),
            )
        head = parent
        committed = (
            tree
            != run_git(
                "rev-parse", f"{parent}^{{tree}}", git_dir=common, cwd=common
            ).text
        )
        if committed:
            head = run_git(
                "commit-tree",
                "--no-gpg-sign",
                tree,
                "-p",
                parent,
                "-F",
                "-",
                git_dir=common,
                cwd=common,
                stdin=message.encode(),
                extra_env=_identity(),
            ).text
            run_git(
                "update-ref",
                "-m",
                "loopsweb: the run's work",
                f"refs/heads/{worktree.branch}",
                head,
                parent,
                git_dir=common,
                cwd=common,
            )
            # The commit is made; the worktree's index is a convenience for a later step.
            _index_at(worktree, head, check=False)
        stat_text = _diffstat(worktree, head)
    except (GitError, SecretInWork) as exc:
        raise WorktreeError(COMMIT_FAILED.format(error=exc)) from None
    return WorktreeCommit(
        branch=worktree.branch, head=head, diffstat=stat_text, committed=committed
    )


def worktree_changes(worktree: Worktree) -> list[str]:
    """The paths `worktree_commit` would commit now (module docstring, `worktree_changes`);
    WorktreeError when the worktree's `.git` was tampered with or its branch is gone."""
    problem = worktree_tampered(worktree)
    if problem is not None:
        raise WorktreeError(problem)
    head = _branch_head(worktree.common_dir, worktree.branch)
    if head is None:
        raise WorktreeError(BRANCH_GONE.format(branch=worktree.branch))
    return tree_changes(worktree.common_dir, worktree.path, head)


def tree_changes(common_dir: str, path: str, commit: str) -> list[str]:
    """The paths of the directory `path` that differ from `commit` (module docstring,
    `worktree_changes`); WorktreeError when they cannot be read."""
    try:
        with tempfile.TemporaryDirectory(prefix="loopsweb-changes-") as scratch:
            return changed_paths(
                common_dir=common_dir,
                work_tree=path,
                commit=commit,
                scratch=Path(scratch),
            )
    except (GitError, OSError) as exc:
        raise WorktreeError(CHANGES_UNREADABLE.format(path=path, error=exc)) from None


def _identity() -> dict[str, str]:
    name, email = parse_git_author(settings.LOOPSWEB_GIT_AUTHOR)  # checked at start-up
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email} | {
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


def _diffstat(worktree: Worktree, head: str) -> str:
    """The diffstat of the run's branch against its fork point: where the project's HEAD
    was when the run's worktree was made."""
    common = worktree.common_dir
    project_head = resolve_commit(project_repository(worktree.project).git_dir, "HEAD")
    if project_head is None:
        return ""
    base = run_git("merge-base", project_head, head, git_dir=common, cwd=common).text
    if base == head:
        return ""
    stat_text = run_git(
        "diff",
        "--stat",
        "--no-color",
        base,
        head,
        git_dir=common,
        cwd=common,
    ).text
    if len(stat_text) > DIFFSTAT_CHARS:
        stat_text = stat_text[: DIFFSTAT_CHARS - 1] + "…"
    return stat_text
