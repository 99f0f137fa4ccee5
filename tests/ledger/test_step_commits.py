"""One commit per agent step that changed files, under its own name (issue 40 item 1):
real git, the fake agent in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger.models import RunStatus
from runs.runner import run_workflow_run
from runs.worktrees import worktree_branch
from tests.ledger.runner_helpers import (
    FakeAgent,
    git,
    git_project,
    route_generic,
    steps_of,
)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _log(project: Path, branch: str) -> list[dict[str, str]]:
    """The run's commits since main, oldest first: author, committer, subject, body."""
    out = git(
        project,
        "log",
        "--reverse",
        "--format=%an <%ae>%x1f%cn <%ce>%x1f%s%x1f%b%x1e",
        f"main..{branch}",
    )
    commits = []
    for record in out.split("\x1e"):
        if record.strip():
            author, committer, subject, body = record.strip("\n").split("\x1f")
            commits.append(
                {
                    "author": author,
                    "committer": committer,
                    "subject": subject,
                    "body": body,
                }
            )
    return commits


def test_each_step_that_changed_files_gets_its_own_commit_with_trailers(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_GIT_AUTHOR = "Review Bot <bot@example.test>"
    project = git_project(tmp_path / "repo")
    agent.configure(
        steps={"worker": {"write": "worker.txt"}, "verifier": {"write": "verifier.txt"}}
    )
    run = route_generic(project, title="Fix the\x1b[31m build", created=True).run
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    run.refresh_from_db()
    branch = worktree_branch(run.id)
    commits = _log(project, branch)
    assert [c["subject"].rsplit(": ", 1)[1] for c in commits] == [
        "step worker",
        "step verifier",
    ]
    steps = steps_of(run)
    for commit, step_id in zip(commits, ("worker", "verifier"), strict=True):
        step = steps[step_id]
        assert (
            commit["author"] == commit["committer"] == "Review Bot <bot@example.test>"
        )
        # The control character of the title never reaches the message.
        assert commit["subject"].startswith("Fix the [31m build (task ")
        assert "\x1b" not in commit["subject"] + commit["body"]
        assert f"Loopsweb-Run: {run.id}" in commit["body"]
        assert f"Loopsweb-Step: {step_id}" in commit["body"]
        assert f"Loopsweb-Account: {step.account_profile or '-'}" in commit["body"]
        assert f"Loopsweb-Provider: {step.account_tool or '-'}" in commit["body"]
        # The step records its own commit and the diffstat of that commit alone.
        assert step.commit_sha is not None
        assert f"{step_id}.txt" in (step.commit_diffstat or "")
    worker, verifier = steps["worker"], steps["verifier"]
    assert "verifier.txt" not in (worker.commit_diffstat or "")
    assert "worker.txt" not in (verifier.commit_diffstat or "")
    assert (
        git(project, "rev-parse", branch).strip()
        == verifier.commit_sha
        == run.commit_head
    )
    trailers = git(
        project, "log", "-1", "--format=%(trailers:key=Loopsweb-Step,valueonly)", branch
    )
    assert trailers.strip() == "verifier"


def test_a_step_that_changed_nothing_records_no_commit(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    agent.configure(steps={"worker": {"write": "only-worker.txt"}})
    run = route_generic(project, created=True).run
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    steps = steps_of(run)
    assert steps["worker"].commit_sha is not None
    assert steps["verifier"].commit_sha is None
    assert len(_log(project, worktree_branch(run.id))) == 1


def test_a_failed_steps_work_is_committed_under_its_name(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    agent.configure(steps={"worker": {"write": "half.txt", "exit": 3}})
    run = route_generic(project, created=True).run
    assert run_workflow_run(run.id) == RunStatus.FAILED
    commits = _log(project, worktree_branch(run.id))
    assert [c["subject"].rsplit(": ", 1)[1] for c in commits] == ["step worker"]
    assert steps_of(run)["worker"].commit_sha is not None


def test_a_bad_git_author_is_refused_at_start_up() -> None:
    from domain.delivery import parse_git_author

    assert parse_git_author("A B <a@b>") == ("A B", "a@b")
    for bad in ("nobody", "<a@b>", "A <a b>", "A\n <a@b>", "A <a@b> x"):
        with pytest.raises(ValueError, match="LOOPSWEB_GIT_AUTHOR"):
            parse_git_author(bad)


def test_manage_py_refuses_to_start_with_a_bad_git_author(tmp_path: Path) -> None:
    from tests.processes import manage, terminal_env

    env = terminal_env(tmp_path, SECRET_KEY="x", LOOPSWEB_GIT_AUTHOR="no email here")
    done = manage(env, "check", check=False)
    assert done.returncode != 0
    assert "LOOPSWEB_GIT_AUTHOR must be 'Name <email>'" in done.stderr
