"""Two runs of one git project at the same time, each runner its own process
(`manage.py run_workflow`), each agent (the fake agent) in the run's own worktree."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.models import RunStatus, WorkflowRun
from routing.admission import CREATED, route_event, route_options
from runs.worktrees import worktree_branch, worktree_dir
from tests.ledger.runner_helpers import (
    VENV_BIN,
    child_database_url,
    git,
    git_project,
    kill_group_quietly,
    spawn_runner,
    steps_of,
)
from tests.processes import manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _admit(project: Path, n: int) -> WorkflowRun:
    event = {
        "id": f"evt-wt-{n}-{time.time_ns()}",
        "type": "build.failed",
        "source": "ci",
        "data": {"project_path": str(project), "title": f"Fix {n}", "message": "x"},
    }
    result = route_event(
        kind="generic", envelope=event, options=route_options({}), env={}
    )
    assert result.kind == CREATED and result.run is not None
    return result.run


def _records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def _files_seen(stdout: str) -> list[str]:
    (line,) = [x for x in stdout.splitlines() if x.startswith("FAKE_AGENT_FILES ")]
    return json.loads(line.split(" ", 1)[1])


def test_two_runs_of_one_project_work_at_once_each_in_its_own_worktree(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "repo")
    runs = [_admit(project, 1), _admit(project, 2)]
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    config = tmp_path / "agents.json"
    # Only the workers meet at the barrier: both are running before either goes on.
    config.write_text(
        json.dumps({"steps": {"worker": {"barrier": str(barrier), "barrier_count": 2}}})
    )
    children = []
    try:
        for n, run in enumerate(runs, start=1):
            records = tmp_path / f"records-{n}"
            records.mkdir()
            env = {
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "FAKE_AGENT_RECORD_DIR": str(records),
                "FAKE_AGENT_CONFIG": str(config),
                "FAKE_AGENT_WRITE": f"from-run-{n}.txt",
                # In the worker's environment, never in the agent's.
                "AWS_SECRET_ACCESS_KEY": "do-not-leak",
                "GH_TOKEN": "passed-on-purpose",
                "LOOPSWEB_AGENT_ENV_PASSTHROUGH": "FAKE_AGENT_*,GH_TOKEN",
            }
            children.append(spawn_runner(run.id, extra_env=env))
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err[-2000:]
    finally:
        for child in children:
            kill_group_quietly(child.pid if child.poll() is None else None)

    seen_cwds = set()
    for n, run in enumerate(runs, start=1):
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, run.error
        path, branch = worktree_dir(run.id), worktree_branch(run.id)
        assert (run.worktree_path, run.worktree_branch) == (str(path), branch)
        records = _records(tmp_path / f"records-{n}")
        assert [r["step"] for r in records] == ["worker", "verifier"]
        # Every step of the run worked in the run's worktree, on the run's branch.
        assert {(r["cwd"], r["branch"]) for r in records} == {(str(path), branch)}
        seen_cwds.add(str(path))
        # Each wrote its own file and never saw the other run's.
        other = f"from-run-{3 - n}.txt"
        for step in steps_of(run).values():
            files = _files_seen(step.stdout)
            assert f"from-run-{n}.txt" in files and other not in files
        names = set(records[0]["env_names"])
        assert "GH_TOKEN" in names and "AWS_SECRET_ACCESS_KEY" not in names
        # Succeeded: the worktree is gone; its file is committed on the run's branch.
        assert not path.exists() and run.worktree_removed_at is not None
        assert git(project, "show", f"{branch}:from-run-{n}.txt").strip()
    assert len(seen_cwds) == 2
    # Both workers held the barrier together: they ran at the same time.
    workers = [steps_of(run)["worker"] for run in runs]
    assert max(w.started_at for w in workers) < min(w.finished_at for w in workers)
    assert len(list(barrier.iterdir())) == 2
    # The project itself is untouched and lists no leftover worktree or branch.
    assert sorted(p.name for p in project.iterdir()) == [".git", "README"]
    assert git(project, "worktree", "list", "--porcelain").count("worktree ") == 1
    # The runs' branches stay: each carries the file its agent left uncommitted.
    assert sorted(
        line.strip(" *+")
        for line in git(project, "branch", "--list", "loopsweb/*").splitlines()
    ) == sorted(worktree_branch(run.id) for run in runs)


def test_a_failed_runs_worktree_is_kept_until_prune_worktrees_removes_it(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "repo")
    run = _admit(project, 3)
    records = tmp_path / "records"
    records.mkdir()
    child = spawn_runner(
        run.id,
        extra_env={
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FAKE_AGENT_RECORD_DIR": str(records),
            "FAKE_AGENT_EXIT": "2",
        },
    )
    try:
        _out, err = child.communicate(timeout=120)
    finally:
        kill_group_quietly(child.pid if child.poll() is None else None)
    assert child.returncode == 1 and "step exited with code 2" in err
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    kept = Path(run.worktree_path)
    assert kept == worktree_dir(run.id) and (kept / "README").exists()

    def prune(*args: str) -> dict[str, Any]:
        env = {**os.environ, "DATABASE_URL": child_database_url()}
        return json.loads(manage(env, "prune_worktrees", "--json", *args).stdout)

    assert prune()["pruned"] == []  # kept for LOOPSWEB_WORKTREE_KEEP_SECONDS
    assert kept.exists()
    report = prune("--keep-seconds", "0")
    assert [(p["runId"], p["status"]) for p in report["pruned"]] == [
        (run.id, RunStatus.FAILED)
    ]
    assert not kept.exists()
    run.refresh_from_db()
    assert run.worktree_removed_at is not None
    assert git(project, "branch", "--list", "loopsweb/*").strip() == ""
