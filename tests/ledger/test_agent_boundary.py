"""The agent boundary in this process (issue 38), with real git: the one git runner, files
written and committed without filters or symlinks followed, projects whose repository lies
outside the roots. tests/ledger/test_agent_boundary_process.py runs the hostile agent
through the processes `make run` starts."""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.hosts import hosts_snapshot
from ledger.models import RunStatus, WorkflowInvocation, WorkflowRun, WorkflowWorkItem
from runs.git import repository_at, run_git
from runs.projects import ProjectPathError, project_path_admit, repository_dirs
from runs.runner import run_workflow_run
from runs.worktrees import (
    Worktree,
    WorktreeError,
    worktree_branch,
    worktree_commit,
    worktree_create,
)
from tests.ledger.runner_helpers import FakeAgent, git, git_project, route_generic

pytestmark = pytest.mark.slow  # real git processes

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("domain", "agents", "ledger", "runs", "routing", "loopsweb")


def _run_id() -> str:
    return uuid.uuid4().hex


def _mark_command(tmp_path: Path) -> tuple[str, Path]:
    mark = tmp_path / "marks"
    script = tmp_path / "mark.sh"
    script.write_text(f'#!/bin/sh\necho "$0 $*" >> {mark}\ncat\n')
    script.chmod(0o755)
    return str(script), mark


# --- one git runner --------------------------------------------------------------------------


def _calls_git(tree: ast.AST) -> list[int]:
    """Lines that name the git binary: the setting, or a literal "git" first in a list."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "LOOPSWEB_GIT_BIN":
            found.append(node.lineno)
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in (
                "git",
                "/usr/bin/git",
            ):
                found.append(node.lineno)
    return found


def test_only_runs_git_runs_git_in_the_product() -> None:
    offenders = []
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            name = str(path.relative_to(ROOT))
            if name in ("runs/git.py", "loopsweb/settings/agents.py"):
                continue
            lines = _calls_git(ast.parse(path.read_text(), name))
            offenders += [f"{name}:{line}" for line in lines]
    assert offenders == [], "git run outside runs/git.py: " + ", ".join(offenders)


def test_the_git_check_sees_a_git_call() -> None:
    source = (
        "import subprocess\n"
        "subprocess.run(['git', 'status'])\n"
        "subprocess.run([settings.LOOPSWEB_GIT_BIN, 'add'])\n"
    )
    assert _calls_git(ast.parse(source)) == [2, 3]


def test_run_git_runs_nothing_the_repository_config_names(tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    command, mark = _mark_command(tmp_path)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "reference-transaction").write_text(f"#!/bin/sh\n{command}\n")
    (hooks / "reference-transaction").chmod(0o755)
    for key, value in (
        ("core.fsmonitor", command),
        ("core.hooksPath", str(hooks)),
        ("core.pager", command),
        ("diff.external", command),
    ):
        git(project, "config", key, value)
    (project / "README").write_text("changed\n")
    git_dir = str(project / ".git")
    run_git(
        "status",
        "--porcelain",
        git_dir=git_dir,
        cwd=str(project),
        work_tree=str(project),
    )
    run_git("diff", git_dir=git_dir, cwd=str(project), work_tree=str(project))
    run_git("update-ref", "refs/heads/other", "HEAD", git_dir=git_dir, cwd=git_dir)
    assert not mark.exists()
    # The same status through a plain git runs the agent's command: the check can fail.
    subprocess.run(
        ["git", "-C", str(project), "status"], capture_output=True, check=False
    )
    assert mark.exists()


def test_discovery_stops_at_the_project_itself(tmp_path: Path) -> None:
    outer = git_project(tmp_path / "outer")
    inner = outer / "plain"
    inner.mkdir()
    with pytest.raises(Exception, match="not a git repository"):
        repository_at(str(inner))
    assert repository_at(str(outer)).common_dir == str((outer / ".git").resolve())


# --- files in and out without filters or symlinks -----------------------------------------


@pytest.mark.django_db
def test_a_new_worktree_gets_the_committed_bytes_and_no_smudge_filter_runs(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "repo")
    command, mark = _mark_command(tmp_path)
    (project / ".gitattributes").write_text("*.txt filter=evil\n")
    (project / "data.txt").write_text("raw bytes\n")
    (project / "tool.sh").write_text("#!/bin/sh\n")
    (project / "tool.sh").chmod(0o755)
    (project / "link").symlink_to("data.txt")
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "attributes")
    git(project, "config", "filter.evil.smudge", command)
    git(project, "config", "filter.evil.clean", command)
    git(project, "config", "filter.evil.required", "true")

    wt = worktree_create(project=str(project), run_id=_run_id())
    path = Path(wt.path)
    assert (path / "data.txt").read_text() == "raw bytes\n"
    assert os.access(path / "tool.sh", os.X_OK)
    assert os.readlink(path / "link") == "data.txt"
    assert (path / ".git").read_text().strip().endswith(f"/.git/worktrees/{path.name}")
    # Its index is the commit's: the worktree's own git sees no change.
    status = run_git(
        "diff",
        "--cached",
        "--name-only",
        "HEAD",
        git_dir=f"{wt.common_dir}/worktrees/{path.name}",
        cwd=wt.path,
        work_tree=wt.path,
    )
    assert status.text == ""
    # And its commit applies no clean filter either: the agent's bytes as written.
    (path / "data.txt").write_text("the agent's bytes\n")
    commit = worktree_commit(wt, message="m")
    assert commit.committed
    shown = git(
        project,
        "-c",
        "filter.evil.smudge=cat",
        "-c",
        "filter.evil.clean=cat",
        "cat-file",
        "blob",
        f"{commit.head}:data.txt",
    )
    assert shown == "the agent's bytes\n"
    assert not mark.exists()


@pytest.mark.django_db
def test_a_commit_takes_symlinks_as_symlinks_and_never_reads_through_them(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "repo")
    (project / "src").mkdir()
    (project / "src" / "app.py").write_text("print(1)\n")
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "src")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "app.py").write_text("SECRET\n")
    (outside / "key").write_text("SECRET\n")
    wt = worktree_create(project=str(project), run_id=_run_id())
    path = Path(wt.path)
    # The agent swaps a tracked directory for a link out, and links a file out.
    for entry in (path / "src").iterdir():
        entry.unlink()
    (path / "src").rmdir()
    (path / "src").symlink_to(outside)
    (path / "key").symlink_to(outside / "key")
    commit = worktree_commit(wt, message="m")
    tree = git(project, "ls-tree", "-r", commit.head)
    assert "120000" in tree and "src/app.py" not in tree
    blobs = [
        git(project, "cat-file", "-p", line.split()[2]) for line in tree.splitlines()
    ]
    assert not any("SECRET" in blob for blob in blobs)
    assert sorted(blobs) == sorted(["project\n", str(outside), str(outside / "key")])


@pytest.mark.django_db
def test_a_tampered_worktree_is_refused_and_nothing_is_committed(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "repo")
    wt = worktree_create(project=str(project), run_id=_run_id())
    (Path(wt.path) / "work.txt").write_text("work\n")
    (Path(wt.path) / ".git").write_text(f"gitdir: {project / '.git'}\n")
    before = git(project, "for-each-ref")
    with pytest.raises(WorktreeError, match="no longer names the run's git dir"):
        worktree_commit(wt, message="m")
    assert git(project, "for-each-ref") == before
    assert (Path(wt.path) / "work.txt").exists()


# --- a repository outside the roots ----------------------------------------------------------


def _foreign_checkout(tmp_path: Path, outside: Path) -> Path:
    """A directory inside the roots whose `.git` FILE names a repository outside them."""
    project = tmp_path / "innocent"
    project.mkdir()
    (project / ".git").write_text(f"gitdir: {outside / '.git'}\n")
    return project


@pytest.fixture
def outside_repo() -> Iterator[Path]:
    # Outside the suite's roots (its base temp dir and /srv).
    base = Path(tempfile.mkdtemp(prefix="loopsweb-outside-", dir="/var/tmp"))
    try:
        yield git_project(base / "repo")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_repository_dirs_follow_a_git_file_as_git_does(
    tmp_path: Path, outside_repo: Path
) -> None:
    project = _foreign_checkout(tmp_path, outside_repo)
    assert repository_dirs(str(project)) == (str((outside_repo / ".git").resolve()),)
    linked = tmp_path / "linked"
    git(outside_repo, "worktree", "add", "-q", str(linked))
    dirs = repository_dirs(str(linked))
    assert dirs == (
        str((outside_repo / ".git" / "worktrees" / "linked").resolve()),
        str((outside_repo / ".git").resolve()),
    )
    # git agrees.
    found = repository_at(str(linked))
    assert (found.git_dir, found.common_dir) == dirs


@pytest.mark.django_db
def test_admission_refuses_a_project_whose_repository_is_outside_the_roots(
    tmp_path: Path, outside_repo: Path
) -> None:
    project = _foreign_checkout(tmp_path, outside_repo)
    with pytest.raises(ProjectPathError, match="lies outside LOOPSWEB_PROJECT_ROOTS"):
        project_path_admit(str(project), hosts_snapshot())
    event = (
        '{"id": "e1", "type": "build.failed", "source": "ci", '
        f'"data": {{"project_path": "{project}", "title": "t", "message": "m"}}}}'
    )
    err = io.StringIO()
    with pytest.raises(CommandError, match="lies outside LOOPSWEB_PROJECT_ROOTS"):
        call_command("route_event", "generic", "--event-json", event, stderr=err)
    assert WorkflowInvocation.objects.count() == WorkflowWorkItem.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.slow
def test_a_git_file_planted_after_admission_fails_the_run_before_any_step(
    agent: FakeAgent, tmp_path: Path, outside_repo: Path
) -> None:
    project = tmp_path / "plain"
    project.mkdir()
    run = route_generic(project, created=True).run
    assert run is not None
    # An earlier agent in this non-git project plants a `.git` file naming elsewhere.
    (project / ".git").write_text(f"gitdir: {outside_repo / '.git'}\n")
    before = git(outside_repo, "for-each-ref")
    assert run_workflow_run(run.id) == RunStatus.FAILED
    run = WorkflowRun.objects.get(pk=run.id)
    assert "lies outside LOOPSWEB_PROJECT_ROOTS" in (run.error or "")
    assert agent.records() == []
    assert git(outside_repo, "for-each-ref") == before
    assert worktree_branch(run.id) not in git(outside_repo, "branch", "--list")


def test_worktree_needs_its_repository(tmp_path: Path) -> None:
    wt = Worktree(
        project=str(tmp_path),
        path=str(tmp_path / "x"),
        branch="b",
        common_dir="/nowhere",
    )
    with pytest.raises(WorktreeError):
        worktree_commit(wt, message="m")


# --- the step guard ---------------------------------------------------------------------------


@pytest.mark.parametrize("signal_name", ["KILL", "TERM"])
def test_the_step_guard_ends_as_its_step_ended_by_a_signal(signal_name: str) -> None:
    # A step killed by SIGKILL (the guard's own kill after the grace, the OOM killer) is
    # recorded as killed, not as "exit code 1" (a load run found it so: no handler can be
    # reset for SIGKILL).
    from runs.processes import STEP_GUARD

    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            STEP_GUARD,
            "1",
            "1",
            str(os.getpid()),
            "--",
            "sh",
            "-c",
            f"kill -{signal_name} $$",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    number = getattr(signal, f"SIG{signal_name}")
    assert done.returncode == -number
    # The step's wait status too: in a sandbox the guard cannot die of the step's signal.
    assert json.loads(done.stdout) == {"ended": 0, "status": number}
