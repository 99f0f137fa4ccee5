"""The one way loopsweb runs git (docs/isolation.md): on repositories an agent can write to.

An agent works in a checkout of the project and can write everything git reads there: the
worktree's `.git` file, the repository's config (a linked worktree shares it), attributes,
hooks, refs. loopsweb runs git on that afterwards, as itself. So every git process it starts
is started by `run_git` below, and nothing else in the product calls git
(tests/ledger/test_agent_boundary.py fails on any other call):

1. **No discovery.** The repository is always named (`GIT_DIR`, and `GIT_WORK_TREE` where a
   work tree is read); the one call that looks for a repository (`repository_at`, on the
   project directory itself) has discovery cut off above it (`GIT_CEILING_DIRECTORIES`).
2. **No configuration that runs something.** System and global config are off
   (`GIT_CONFIG_NOSYSTEM`, `GIT_CONFIG_GLOBAL=/dev/null`, `GIT_ATTR_NOSYSTEM`); every call
   overrides, on its command line (which wins over every config file and include), each
   setting that names a program or a hook: `core.fsmonitor`, `core.hooksPath`,
   `core.sshCommand`, `core.askPass`, `core.pager`, `core.editor`, `sequence.editor`,
   `credential.helper`, `core.alternateRefsCommand`, signing; no transport may run
   (`protocol.allow=never`), no automatic gc or maintenance, no replace refs. A command
   that can show a diff gets `--no-ext-diff --no-textconv` (`diff.external` and textconv
   drivers have no value that turns them off).
3. **No filter.** Filter drivers (`filter.<name>.clean/smudge/process`) are chosen by an
   attribute file in the tree and defined in config the agent can write, and no switch turns
   them all off. So loopsweb never asks git to read or write work-tree files through them:
   runs.worktree_files writes a new worktree's files from the objects and commits a
   worktree's files with plumbing (`hash-object --no-filters`, `update-index --index-info`,
   `write-tree`, `commit-tree`, `update-ref`). Diffs pass `--no-ext-diff --no-textconv`.
4. **A clean environment.** PATH, HOME and `LC_ALL=C` only, no terminal prompt, no stdin
   unless given, a timeout.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings

from domain.errors import ApplicationError

GIT_TIMEOUT_SECONDS = 120
GIT_FAILED = "git {command}: {error}"

# Every setting that makes git run a program (module docstring, "no configuration that runs
# something"), neutralised per call.
SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", os.devnull),
    ("core.sshCommand", "false"),
    ("core.askPass", ""),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("credential.helper", ""),
    ("core.alternateRefsCommand", ""),
    ("core.untrackedCache", "false"),
    ("core.excludesFile", os.devnull),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("protocol.allow", "never"),
    ("submodule.recurse", "false"),
    ("color.ui", "false"),
)


# A push (runs.delivery) may reach a remote: only these settings change, each to the
# operator's (LOOPSWEB_GIT_SSH_COMMAND, LOOPSWEB_GIT_CREDENTIAL_HELPER), never to a value
# read from a repository's config; the other overrides above stay.
TRANSPORT_SETTINGS = frozenset(
    {"core.sshCommand", "credential.helper", "protocol.allow"}
)
TRANSPORT_PROTOCOLS = ("file", "ssh", "https", "http")


def _transport_config() -> list[tuple[str, str]]:
    config = [("core.sshCommand", settings.LOOPSWEB_GIT_SSH_COMMAND)]
    config += [("credential.helper", "")]  # an empty value resets the list
    if settings.LOOPSWEB_GIT_CREDENTIAL_HELPER:
        config += [("credential.helper", settings.LOOPSWEB_GIT_CREDENTIAL_HELPER)]
    config += [("protocol.allow", "never")]
    config += [(f"protocol.{name}.allow", "always") for name in TRANSPORT_PROTOCOLS]
    return config


class GitError(ApplicationError):
    """A git command failed (its message is git's last line of error output)."""


@dataclass(frozen=True)
class GitResult:
    returncode: int
    stdout: bytes
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace").strip()


def git_environment(
    *,
    git_dir: str | None,
    work_tree: str | None,
    ceiling: str | None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of a git process (module docstring: "no discovery", "no
    configuration that runs something" and "a clean environment")."""
    env = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    env.update(
        LC_ALL="C",
        GIT_TERMINAL_PROMPT="0",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_ATTR_NOSYSTEM="1",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_OPTIONAL_LOCKS="0",
        GIT_PAGER="cat",
        GIT_EDITOR="false",
    )
    if git_dir is not None:
        env["GIT_DIR"] = git_dir
    if work_tree is not None:
        env["GIT_WORK_TREE"] = work_tree
    if ceiling is not None:
        env["GIT_CEILING_DIRECTORIES"] = ceiling
    env.update(extra or {})
    return env


def run_git(
    *args: str,
    git_dir: str | None,
    cwd: str,
    work_tree: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    check: bool = True,
    transport: bool = False,
) -> GitResult:
    """Run `git ARGS` on the repository `git_dir` (module docstring); raises GitError when
    git cannot run, or (with `check`) exits non-zero.

    `git_dir=None` only for `repository_at`: git then looks for a repository in `cwd`
    itself and nowhere above it.
    """
    ceiling = os.path.dirname(os.path.abspath(cwd)) if git_dir is None else None
    argv = [settings.LOOPSWEB_GIT_BIN, "--no-pager"]
    config = list(SAFE_CONFIG)
    if transport:  # a push: runs.delivery, TRANSPORT_SETTINGS
        config = [c for c in config if c[0] not in TRANSPORT_SETTINGS]
        config += _transport_config()
    for name, value in config:
        argv += ["-c", f"{name}={value}"]
    argv += _no_diff_programs(args)
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=git_environment(
                git_dir=git_dir, work_tree=work_tree, ceiling=ceiling, extra=extra_env
            ),
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise GitError(GIT_FAILED.format(command=_name(args), error=exc)) from None
    result = GitResult(
        returncode=done.returncode,
        stdout=done.stdout,
        stderr=done.stderr.decode("utf-8", "replace"),
    )
    if check and result.returncode != 0:
        raise GitError(
            GIT_FAILED.format(command=_name(args), error=git_error_line(result))
        )
    return result


DIFF_COMMANDS = frozenset(
    {"diff", "log", "show", "diff-tree", "diff-index", "diff-files"}
)


def _no_diff_programs(args: tuple[str, ...]) -> list[str]:
    """`args` with `--no-ext-diff --no-textconv` after a diff-showing command's name."""
    if args and args[0] in DIFF_COMMANDS:
        return [args[0], "--no-ext-diff", "--no-textconv", *args[1:]]
    return list(args)


def _name(args: tuple[str, ...]) -> str:
    return next((arg for arg in args if not arg.startswith("-")), "git")


def git_error_line(result: GitResult) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"git exited with code {result.returncode}"


@dataclass(frozen=True)
class Repository:
    """A project's repository as git resolves it: `git_dir` is the project checkout's own
    (its HEAD and index), `common_dir` the repository's (objects, refs, config, and the
    records of linked worktrees); both real paths. They differ when the project is itself a
    linked worktree."""

    top: str
    git_dir: str
    common_dir: str


def repository_at(project: str) -> Repository:
    """The repository of the git work tree whose top is `project`, as git itself finds it
    (`rev-parse`, discovery cut off above `project`); GitError when there is none."""
    result = run_git(
        "rev-parse",
        "--path-format=absolute",
        "--show-toplevel",
        "--absolute-git-dir",
        "--git-common-dir",
        git_dir=None,
        cwd=project,
    )
    lines = result.stdout.decode("utf-8", "surrogateescape").splitlines()
    if len(lines) != 3:
        raise GitError(
            GIT_FAILED.format(command="rev-parse", error="unexpected answer")
        )
    top, git_dir, common = (os.path.realpath(line) for line in lines)
    return Repository(top=top, git_dir=git_dir, common_dir=common)


def object_format(common_dir: str) -> str:
    """`sha1` or `sha256`: how the repository names its objects."""
    result = run_git(
        "rev-parse", "--show-object-format", git_dir=common_dir, cwd=common_dir
    )
    return result.text or "sha1"


def resolve_commit(git_dir: str, rev: str) -> str | None:
    """The commit `rev` names in `git_dir`, or None."""
    result = run_git(
        "rev-parse",
        "--verify",
        "--quiet",
        "--end-of-options",
        f"{rev}^{{commit}}",
        git_dir=git_dir,
        cwd=git_dir,
        check=False,
    )
    return result.text if result.returncode == 0 and result.text else None
