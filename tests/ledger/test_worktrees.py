"""Per-run git worktrees, the project-root check at step start and the agent environment
(issue 16), with the fake agent in this process; tests/ledger/test_worktrees_process.py
runs two runners as real processes at once."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from ledger.models import RunStatus, StepStatus, WorkflowRun
from runs import tasks
from runs.providers import child_environment
from runs.runner import run_workflow_run
from runs.worktree_prune import worktrees_prune
from runs.worktrees import worktree_branch, worktree_dir
from tests.ledger.runner_helpers import (
    FakeAgent,
    git,
    git_project,
    route_generic,
    steps_of,
)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _branches(project: Path) -> list[str]:
    return git(
        project, "branch", "--list", "loopsweb/*", "--format=%(refname:short)"
    ).split()


def _worktrees(project: Path) -> list[str]:
    listing = git(project, "worktree", "list", "--porcelain")
    return [
        line.split(" ", 1)[1]
        for line in listing.splitlines()
        if line.startswith("worktree ")
    ]


def test_a_git_project_runs_in_its_own_worktree_which_goes_when_the_run_succeeds(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    agent.env(write="note.txt")
    run = route_generic(project, created=True).run
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    run.refresh_from_db()
    path, branch = worktree_dir(run.id), worktree_branch(run.id)
    assert (run.worktree_path, run.worktree_branch) == (str(path), branch)
    assert run.worktree_removed_at is not None
    records = agent.records()
    assert [r["step"] for r in records] == ["worker", "verifier"]
    assert {(r["cwd"], r["branch"]) for r in records} == {(str(path), branch)}
    # Both steps worked in the same worktree: the verifier saw the worker's file.
    verifier = steps_of(run)["verifier"]
    assert 'FAKE_AGENT_FILES [".git", "README", "note.txt"]' in verifier.stdout
    # Gone: the directory and git's record of it; the file the agent left uncommitted is
    # committed on the run's branch first (author loopsweb), so the branch stays.
    assert not path.exists()
    assert _worktrees(project) == [str(project)]
    assert _branches(project) == [branch]
    assert not (project / "note.txt").exists()
    assert git(project, "show", f"{branch}:note.txt")
    author, subject = git(project, "log", "-1", "--format=%an%n%s", branch).split("\n")[
        :2
    ]
    assert author == "loopsweb"
    # The worker wrote the file: the commit is the worker's (the verifier changed nothing).
    assert subject.endswith(": step worker") and subject.startswith("Fix the build")
    assert run.commit_head == git(project, "rev-parse", branch).strip()
    assert "note.txt" in run.commit_diffstat and "1 file changed" in run.commit_diffstat


def test_a_failed_runs_worktree_is_kept_then_pruned_after_the_keep_time(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_WORKTREE_KEEP_SECONDS = 3600
    project = git_project(tmp_path / "repo")
    agent.env(write="half-done.txt", exit="3")
    run = route_generic(project, created=True).run
    assert run_workflow_run(run.id) == RunStatus.FAILED

    run.refresh_from_db()
    path = Path(run.worktree_path)
    assert path == worktree_dir(run.id) and (path / "half-done.txt").exists()
    assert run.worktree_removed_at is None
    assert _branches(project) == [worktree_branch(run.id)]

    # Not yet due: a prune (the task, the command) leaves it for the operator. (The task
    # also removes orphans: earlier tests' worktrees, whose runs were rolled back.)
    tasks.prune_worktrees()
    run.refresh_from_db()
    assert path.exists() and run.worktree_removed_at is None
    out = io.StringIO()
    call_command("prune_worktrees", "--dry-run", stdout=out)
    assert "would remove 0 worktree(s)" in out.getvalue() and path.exists()

    # Once the keep time has passed, the periodic prune removes it.
    later = run.finished_at + timedelta(seconds=3601)
    pruned = worktrees_prune(now=later)
    assert [(p.run_id, p.status, p.error) for p in pruned] == [
        (run.id, RunStatus.FAILED, None)
    ]
    run.refresh_from_db()
    assert run.worktree_removed_at is not None
    assert not path.exists() and _worktrees(project) == [str(project)]
    # The half-done work was committed when the run ended: pruning keeps the branch.
    assert _branches(project) == [worktree_branch(run.id)]
    assert git(project, "show", f"{worktree_branch(run.id)}:half-done.txt")
    assert worktrees_prune(now=later) == []  # nothing twice


def test_the_prune_command_keeps_a_branch_that_carries_the_agents_commits(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    agent.env(write="work.txt", exit="1")
    run = route_generic(project, created=True).run
    run_workflow_run(run.id)
    run.refresh_from_db()
    # The run's end committed what the agent left (work.txt) on the run's branch.
    assert run.commit_head and "work.txt" in run.commit_diffstat

    out = io.StringIO()
    call_command("prune_worktrees", "--keep-seconds", "0", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert [p["runId"] for p in report["pruned"]] == [run.id]
    assert not Path(run.worktree_path).exists()
    assert _branches(project) == [worktree_branch(run.id)]  # the work survives
    assert (
        git(project, "log", "-1", "--format=%s", worktree_branch(run.id))
        .strip()
        .endswith(": step worker")
    )
    assert git(project, "show", f"{worktree_branch(run.id)}:work.txt") is not None
    with pytest.raises(
        CommandError, match="--keep-seconds must be a non-negative integer"
    ):
        call_command("prune_worktrees", "--keep-seconds", "-1", stdout=io.StringIO())


def test_a_worktree_git_cannot_make_fails_the_run_and_leaves_nothing_behind(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "empty-repo", commit=False)  # no HEAD to check out
    run = route_generic(project, created=True).run
    assert run_workflow_run(run.id) == RunStatus.FAILED

    run.refresh_from_db()
    assert run.error.startswith("workflow cannot run: worktree preparation failed: ")
    assert "HEAD" in run.error
    assert run.worktree_path is None and run.worktree_branch is None
    assert not worktree_dir(run.id).exists()
    assert _branches(project) == [] and _worktrees(project) == [str(project)]
    assert {s.status for s in steps_of(run).values()} == {StepStatus.SKIPPED}
    assert agent.records() == []  # no agent ever started


def test_worktree_mode_off_runs_in_the_project_itself(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    run = route_generic(project, worktree_mode="off", created=True).run
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    assert run.worktree_path is None
    assert {r["cwd"] for r in agent.records()} == {str(project)}


def test_auto_on_a_plain_directory_runs_there_under_the_providers_sandbox(
    agent: FakeAgent, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    run = route_generic(plain, created=True).run
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    records = agent.records()
    assert {r["cwd"] for r in records} == {str(plain)}
    assert all(
        r["argv"][:3] == ["exec", "--sandbox", "workspace-write"] for r in records
    )


def test_a_project_that_stopped_being_a_git_tree_fails_a_required_run(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    run = route_generic(
        project, worktree_mode="required", provider="claude", created=True
    ).run
    # After admission, before the run: the repository goes away.
    import shutil

    shutil.rmtree(project / ".git")
    assert run_workflow_run(run.id) == RunStatus.FAILED
    run.refresh_from_db()
    assert run.error == (
        "workflow cannot run: worktreeMode=required but projectPath is not an existing "
        f"git repository: {project}"
    )
    assert agent.records() == []


def test_an_unsandboxed_provider_admitted_for_a_worktree_never_runs_without_one(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    run = route_generic(
        project, provider="claude", created=True
    ).run  # auto: isolated by the worktree
    import shutil

    shutil.rmtree(project / ".git")  # auto now finds no git work tree
    assert run_workflow_run(run.id) == RunStatus.FAILED
    run.refresh_from_db()
    assert "route step worker has no verified unattended isolation" in run.error
    assert agent.records() == []


def test_no_roots_when_the_run_starts_fails_it_naming_the_setting(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    project = git_project(tmp_path / "repo")
    with_worktree = route_generic(project, created=True).run
    in_place = route_generic(tmp_path, worktree_mode="off", created=True).run
    settings.LOOPSWEB_PROJECT_ROOTS = ()
    assert run_workflow_run(with_worktree.id) == RunStatus.FAILED
    assert run_workflow_run(in_place.id) == RunStatus.FAILED
    for run in (with_worktree, in_place):
        run.refresh_from_db()
        assert "set LOOPSWEB_PROJECT_ROOTS" in run.error, run.error
    assert in_place.error.startswith("step worker failed: no project roots")
    assert agent.records() == []


def test_a_root_removed_since_admission_stops_the_step(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    run = route_generic(
        project, worktree_mode="off", created=True
    ).run  # no worktree: the step checks
    settings.LOOPSWEB_PROJECT_ROOTS = ("/srv",)  # the root that held it is gone
    assert run_workflow_run(run.id) == RunStatus.FAILED
    run.refresh_from_db()
    assert run.error == (
        f"step worker failed: project path {project} resolves to {project}, "
        "outside LOOPSWEB_PROJECT_ROOTS"
    )
    assert steps_of(run)["worker"].status == StepStatus.FAILED
    assert agent.records() == []


def test_the_agent_sees_an_allowlisted_environment(
    agent: FakeAgent,
    tmp_path: Path,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
    monkeypatch.setenv("GH_TOKEN", "passed-on-purpose")
    monkeypatch.setenv("LC_CTYPE", "C.UTF-8")
    monkeypatch.setenv("DATABASE_URL", "sqlite:////secret.sqlite3")
    settings.LOOPSWEB_AGENT_ENV_PASSTHROUGH = ("FAKE_AGENT_*", "GH_TOKEN")
    run = route_generic(tmp_path, auth_profile="acctA", created=True).run
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    names = set(agent.records()[0]["env_names"])
    assert "AWS_SECRET_ACCESS_KEY" not in names and "SSH_AUTH_SOCK" not in names
    assert "DATABASE_URL" not in names and "LOOPSWEB_PROJECT_ROOTS" not in names
    assert {"PATH", "HOME", "LC_CTYPE", "GH_TOKEN"} <= names
    assert {
        "LOOPSWEB_RUN_ID",
        "LOOPSWEB_STEP_ID",
        "LOOPSWEB_ACCOUNT_PROFILE",
        "LOOPSWEB_ACCOUNT_TOOL",
        "CODEWITH_PROFILE",
    } <= names
    assert {n for n in names if n.startswith("LOOPSWEB_")} == {
        "LOOPSWEB_RUN_ID",
        "LOOPSWEB_STEP_ID",
        "LOOPSWEB_ACCOUNT_PROFILE",
        "LOOPSWEB_ACCOUNT_TOOL",
        "LOOPSWEB_PROVIDER",
    }


def test_a_passthrough_pattern_never_reaches_loopsweb_settings(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPSWEB_SECRET_THING", "x")
    monkeypatch.setenv("LOOPY", "y")
    settings.LOOPSWEB_AGENT_ENV_PASSTHROUGH = ("LOOP*",)
    env = child_environment(
        {"LOOPSWEB_RUN_ID": "r1"}, account_env={"ACCOUNT_LOGIN": "acct"}
    )
    assert env["LOOPY"] == "y" and "LOOPSWEB_SECRET_THING" not in env
    assert env["LOOPSWEB_RUN_ID"] == "r1" and env["ACCOUNT_LOGIN"] == "acct"


def test_the_run_pages_show_the_worktree_path_and_branch(
    agent: FakeAgent, tmp_path: Path, admin_client: Client
) -> None:
    project = git_project(tmp_path / "repo")
    agent.env(exit="1")
    result = route_generic(project, created=True)
    run_workflow_run(result.run.id)
    run = WorkflowRun.objects.get(pk=result.run.id)
    path, branch = str(worktree_dir(run.id)), worktree_branch(run.id)

    admin_page = admin_client.get(
        f"/admin/ledger/workflowrun/{run.id}/change/"
    ).content.decode()
    assert f"{path} on branch {branch} (kept until" in admin_page
    ops_page = admin_client.get(f"/ops/items/{result.work_item.id}/").content.decode()
    assert f"{path} on branch {branch} (kept until" in ops_page


def test_sync_schedules_installs_the_periodic_prune() -> None:
    from django_q.models import Schedule

    call_command("sync_schedules", stdout=io.StringIO())
    schedule = Schedule.objects.get(name="prune-worktrees")
    assert schedule.func == "runs.tasks.prune_worktrees"
    assert schedule.schedule_type == Schedule.MINUTES and schedule.minutes == 15
