"""The delivery tests' project and run (tests/ledger/test_delivery.py,
tests/ledger/test_delivery_console.py): a git project whose `origin` is a bare repository on
local disk, a generic task run by the fake agent in this process, and the token the GitHub
stand-in is given (the `forge` fixture, tests/ledger/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledger.models import WorkflowRun
from runs.runner import run_workflow_run
from tests.ledger.runner_helpers import git, git_project, route_generic

# The GitHub token the `forge` fixture writes to the token file delivery reads.
TOKEN = "ghp_standin_token_0123456789"


def project_with_origin(tmp_path: Path) -> tuple[Path, Path]:
    """A project whose `origin` is a bare repository on local disk, main pushed to it."""
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    project = git_project(tmp_path / "repo")
    git(project, "remote", "add", "origin", str(origin))
    git(project, "push", "-q", "origin", "main")
    return project, origin


def remote_branches(origin: Path) -> dict[str, str]:
    """Branch name -> commit, of every branch in `origin`."""
    out = git(origin, "for-each-ref", "--format=%(refname:short) %(objectname)")
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def run_task(project: Path, **options: Any) -> WorkflowRun:
    """Route a generic task on `project` (route options `options`) and run it here, to its
    end; the run as it ended."""
    run = route_generic(
        project, title="Add the note", message="Write note.txt", created=True, **options
    ).run
    assert run is not None
    run_workflow_run(run.id)
    run.refresh_from_db()
    return run
