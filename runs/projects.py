"""Project roots: the only directories an agent may work in (`LOOPSWEB_PROJECT_ROOTS`).

A project path, whether it came from an event, an option or a step's `cwd`, is accepted when:
1. it is a non-empty absolute path with no NUL byte and no `..` segment (there is no `~`
   expansion: `~` is a relative name, refused like any other);
2. its real path (symlinks followed; components that do not exist yet are kept as written)
   lies inside the real path of one configured root.
The project is then the top level of the git work tree that path belongs to, looked for
upwards no further than the root, else the real path itself. With no root configured every
project is refused, with a message naming the setting.

A git project's repository must lie inside the roots too (`repository_dirs`): a `.git`
FILE can name a repository anywhere (an earlier agent in a non-git project could plant one),
and a worktree of it would hand the agent a checkout of that repository. Admission refuses
such a project; the runner checks again, with git's own answer, when it makes the run's
worktree (runs.worktrees.project_repository).

Admission checks with `project_path_admit` (`project_path_resolve` against the roots of its
caller's hosts snapshot, ledger.hosts; before anything is written); the runner checks
again with `project_dir_check` when a step starts, since a root may be gone by then, and
there the directory must exist. Both read the file system only: no git, no subprocess.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from django.conf import settings

from domain.errors import ValidationError
from ledger.hosts import ADMISSION_NO_HOST, HostsSnapshot

ROOTS_UNSET = (
    "no project roots are configured, so no agent may run: set LOOPSWEB_PROJECT_ROOTS "
    "to the directories agents may work in"
)
PATH_EMPTY = (
    "no project path: the event names none (data.project_path and the other "
    "project path fields) and no --project-path was given"
)
PATH_NOT_ABSOLUTE = "project path must be an absolute path: {path!r}"
PATH_DOTDOT = "project path must not contain '..' segments: {path!r}"
PATH_NUL = "project path contains a NUL byte"
PATH_UNRESOLVABLE = "project path {path!r} cannot be resolved: {error}"
PATH_OUTSIDE = "project path {path} resolves to {real}, outside LOOPSWEB_PROJECT_ROOTS"
DIR_MISSING = "project directory does not exist: {path}"
REPOSITORY_OUTSIDE_ROOTS = (
    "project {path}: its git repository {git_dir} lies outside LOOPSWEB_PROJECT_ROOTS"
)
REQUIRED_NOT_GIT = (
    "worktreeMode=required but projectPath is not an existing git repository: {path}"
)


class ProjectPathError(ValidationError):
    """A project path outside the roots, malformed, or with no roots configured."""


class PathOutsideRoots(ProjectPathError):
    """A project path that resolves outside the roots (PATH_OUTSIDE)."""


class WorktreeRequired(ValidationError):
    """worktreeMode=required and the project is no git work tree (REQUIRED_NOT_GIT): a
    route error (docs/upstream.md §5), which a drain skips and goes on."""

    def __init__(self, path: str) -> None:
        super().__init__(REQUIRED_NOT_GIT.format(path=path))


def project_roots() -> tuple[str, ...]:
    """The configured roots, real paths (symlinks of the roots themselves followed)."""
    return tuple(os.path.realpath(root) for root in settings.LOOPSWEB_PROJECT_ROOTS)


def _inside(real: str, roots: Sequence[str]) -> str | None:
    """The root `real` lies in (the deepest, when roots nest), or None."""
    found = [root for root in roots if Path(real).is_relative_to(root)]
    return max(found, key=len) if found else None


def _checked_real(path: str | None, roots: Sequence[str]) -> tuple[str, str]:
    if not roots:
        raise ProjectPathError(ROOTS_UNSET)
    if path is None or not path.strip():
        raise ProjectPathError(PATH_EMPTY)
    if "\x00" in path:
        raise ProjectPathError(PATH_NUL)
    if not os.path.isabs(path):
        raise ProjectPathError(PATH_NOT_ABSOLUTE.format(path=path))
    if ".." in Path(path).parts:
        raise ProjectPathError(PATH_DOTDOT.format(path=path))
    try:
        real = os.path.realpath(path)
    except OSError as exc:  # a name too long, a symlink loop, ...
        raise ProjectPathError(
            PATH_UNRESOLVABLE.format(path=path, error=exc.strerror)
        ) from None
    root = _inside(real, roots)
    if root is None:
        raise PathOutsideRoots(PATH_OUTSIDE.format(path=path, real=real))
    return real, root


def project_path_resolve(path: str | None, roots: Sequence[str] | None = None) -> str:
    """The project a route works on, or ProjectPathError (see the module docstring)."""
    real, root = _checked_real(path, project_roots() if roots is None else roots)
    candidate = Path(real)
    # The git top level, but never above the root: the agent may not reach past it.
    while True:
        try:
            if (candidate / ".git").exists():
                return str(candidate)
        except OSError as exc:
            raise ProjectPathError(
                PATH_UNRESOLVABLE.format(path=path, error=exc.strerror)
            ) from None
        if str(candidate) == root or candidate.parent == candidate:
            return real
        candidate = candidate.parent


def project_path_admit(path: str | None, hosts: HostsSnapshot) -> tuple[str, bool]:
    """Admission's check (several machines): the project and whether it is a git work tree.
    It reads the file system only, and writes nothing.

    With hosts registered (`hosts`, the caller's snapshot) a project is admitted when it lies
    under any registered host's roots, so a drain on one machine admits work for a project
    that only another machine has; a project no host serves is refused, naming the hosts'
    roots. A project that is not on this machine is taken as written, and as a git work tree
    (the runner, on the host that has it, makes the worktree or refuses `required` there).
    With no host registered, this machine's LOOPSWEB_PROJECT_ROOTS decide, as on one
    machine.
    """
    if hosts.roots is None:
        project = project_path_resolve(path)
        return project, _git_inside(project, project_roots())
    real_roots = [os.path.realpath(root) for root in hosts.roots]
    try:
        project = project_path_resolve(path, roots=real_roots)
    except PathOutsideRoots:
        raise ProjectPathError(
            ADMISSION_NO_HOST.format(path=path, roots=", ".join(hosts.roots))
        ) from None
    if not os.path.isdir(project):
        return project, True
    return project, _git_inside(project, real_roots)


def _git_inside(project: str, roots: Sequence[str]) -> bool:
    """Whether `project` is a git work tree; ProjectPathError when its repository lies
    outside `roots` (module docstring)."""
    if not is_git_work_tree(project):
        return False
    for where in repository_dirs(project):
        if _inside(where, roots) is None:
            raise ProjectPathError(
                REPOSITORY_OUTSIDE_ROOTS.format(path=project, git_dir=where)
            )
    return True


def repository_dirs(project: str) -> tuple[str, ...]:
    """The git dirs of the work tree at `project`, real paths, as git finds them: `.git`
    itself when it is a directory, else the `gitdir:` its file names; then the common dir
    that one's `commondir` file names (a linked worktree's). An unreadable `.git` gives
    what was found so far (git refuses it in the runner)."""
    dot_git = os.path.join(project, ".git")
    try:
        if os.path.isdir(dot_git):
            git_dir = os.path.realpath(dot_git)
        else:
            with open(dot_git, encoding="utf-8", errors="replace") as handle:
                text = handle.read(4096)
            if not text.startswith("gitdir:"):
                return ()
            named = text.removeprefix("gitdir:").strip()
            git_dir = os.path.realpath(os.path.join(project, named))
        found = [git_dir]
        common = os.path.join(git_dir, "commondir")
        if os.path.isfile(common):
            with open(common, encoding="utf-8", errors="replace") as handle:
                named = handle.read(4096).strip()
            found.append(os.path.realpath(os.path.join(git_dir, named)))
    except OSError:
        return ()
    return tuple(found)


def project_dir_check(path: str | None, roots: Sequence[str] | None = None) -> str:
    """A step's working directory, checked again when the step starts: inside a root and
    an existing directory. Returns its real path."""
    real, _root = _checked_real(path, project_roots() if roots is None else roots)
    if not os.path.isdir(real):
        raise ProjectPathError(DIR_MISSING.format(path=path))
    return real


def is_git_work_tree(project: str) -> bool:
    """Whether `project` (a resolved project path) is the top of a git work tree.

    `.git` is a directory in a clone and a file in a linked worktree or submodule.
    """
    try:
        return (Path(project) / ".git").exists()
    except OSError:
        return False


def repository_checkout(name: str, roots: Sequence[str] | None = None) -> str | None:
    """The directory under a project root that holds `owner/repo`'s checkout:
    `<root>/<owner>/<repo>`, else `<root>/<repo>`, the first that is a directory (roots in
    their configured order); None when there is none. A todos task's `Repository:` line
    names its project this way (domain/events.py, "the ``Repository:`` line")."""
    owner, _, repo = name.partition("/")
    if not owner or not repo or "/" in repo or ".." in (owner, repo):
        return None
    for root in project_roots() if roots is None else roots:
        for candidate in (Path(root, owner, repo), Path(root, repo)):
            try:
                if candidate.is_dir():
                    return str(candidate)
            except OSError:
                continue
    return None
