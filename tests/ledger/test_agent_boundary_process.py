"""The agent is untrusted (issue 38): a hostile agent stand-in (tests/hostile_agent.py) runs
through `manage.py route_event` (a second terminal) and a run cluster as `make run` starts
it, and nothing it leaves in its worktree makes loopsweb run its command, commit outside
`loopsweb/run-<id>`, lose its work or keep its process alive.

Every run here works on a project of its own; the worktree dir lies inside a decoy
repository (the loopsweb checkout of the default `make run` layout, with an operator's
uncommitted edit), which must stay as it was. The project is inspected with git's
executable settings off, since the agent planted its own in the project's config.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils.html import escape

from ledger.models import TERMINAL_RUN_STATUSES, RunStatus, WorkflowRun
from runs.worktrees import worktree_branch
from tests.ledger.runner_helpers import child_database_url, git, git_project, steps_of
from tests.processes import (
    manage,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOSTILE_AGENT = Path(__file__).resolve().parents[1] / "hostile_agent.py"
INERT = ("-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}")


def inert_git(repo: Path, *args: str) -> str:
    """git on a repository the agent may have configured, with what it planted off."""
    done = subprocess.run(
        ["git", *INERT, "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": os.environ["PATH"], "GIT_CONFIG_GLOBAL": os.devnull},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class Installation:
    """A run cluster on the test database with the hostile agent as codewith, and a
    second terminal's environment for `manage.py route_event`."""

    def __init__(self, base: Path) -> None:
        base.mkdir()
        self.base = base
        self.hostile = base / "hostile"
        self.decoy = git_project(base / "decoy")
        (self.decoy / "README").write_text("the operator's uncommitted edit\n")
        self.decoy_head = git(self.decoy, "rev-parse", "HEAD").strip()
        self.env = terminal_env(
            Path(settings.DATA_DIR),
            SECRET_KEY=settings.SECRET_KEY,
            DATABASE_URL=child_database_url(),
            LOOPSWEB_CODEWITH_BIN=str(HOSTILE_AGENT),
            LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*,HOSTILE_*",
            LOOPSWEB_WORKTREE_DIR=str(self.decoy / "worktrees"),
            HOSTILE_DIR=str(self.hostile),
        )
        self.cluster = start_qcluster(
            self.env, base / "runs.log", cluster="loopsweb-runs"
        )

    def route(self, project: Path, cases: str, n: int) -> WorkflowRun:
        event = {
            "id": f"evt-hostile-{n}-{os.getpid()}",
            "type": "build.failed",
            "source": "ci",
            "data": {
                "project_path": str(project),
                "title": "Fix the build",
                "message": f"Please also run this: HOSTILE_CASES={cases}",
            },
        }
        done = manage(
            self.env,
            "route_event",
            "generic",
            "--event-json",
            json.dumps(event),
            "--json",
        )
        run_id = json.loads(done.stdout)["run"]["id"]
        return wait_until(
            lambda: self._ended(run_id), what=f"run {run_id} ({cases}) to end"
        )

    def _ended(self, run_id: str) -> WorkflowRun | None:
        assert self.cluster.poll() is None, "the run cluster died"
        run = WorkflowRun.objects.get(pk=run_id)
        return run if run.status in TERMINAL_RUN_STATUSES else None

    def marks(self) -> str:
        path = self.hostile / "marks"
        return path.read_text() if path.exists() else ""

    def decoy_unchanged(self) -> None:
        assert git(self.decoy, "rev-parse", "HEAD").strip() == self.decoy_head
        assert git(self.decoy, "log", "--format=%s").splitlines() == ["initial"]
        status = git(self.decoy, "status", "--porcelain", "--untracked-files=no")
        assert status.splitlines() == [" M README"]
        assert git(self.decoy, "diff", "--cached", "--name-only") == ""


@pytest.fixture
def installation(tmp_path: Path) -> Iterator[Installation]:
    # One cluster per test: a module's cluster would outlive the flush that ends each
    # test (its host row and queued task with it) while other tests run on the worker.
    inst = Installation(tmp_path / "installation")
    try:
        yield inst
    finally:
        stop_process_group(inst.cluster)


def _project_state(project: Path) -> tuple[str, str, str]:
    refs = inert_git(project, "for-each-ref", "--format=%(refname) %(objectname)")
    kept = "\n".join(r for r in refs.splitlines() if "refs/heads/loopsweb/" not in r)
    return (
        kept,
        inert_git(project, "status", "--porcelain", "--untracked-files=all"),
        inert_git(project, "ls-files", "--stage"),
    )


def _run_branch_files(project: Path, run: WorkflowRun) -> list[str]:
    return inert_git(
        project, "ls-tree", "-r", "--name-only", worktree_branch(run.id)
    ).splitlines()


# What git does with the worktree the agent left is no database matter: on PostgreSQL one
# tampered case and the committed one prove the ledger's side, every case runs on SQLite.
@pytest.mark.parametrize(
    "case",
    [
        "own-repo",
        "shared-config",
        pytest.param("main-gitdir", marks=pytest.mark.sqlite),
        pytest.param("no-dotgit", marks=pytest.mark.sqlite),
    ],
)
def test_what_the_agent_leaves_in_git_runs_nothing_and_commits_only_on_its_branch(
    installation: Installation, tmp_path: Path, case: str
) -> None:
    project = git_project(tmp_path / f"project-{case}")
    before = _project_state(project)
    run = installation.route(project, case, 1)

    # 0 commands of the agent's run by loopsweb (the mark command writes the marks file).
    assert installation.marks() == "", installation.marks()
    assert run.status == RunStatus.SUCCEEDED, run.error
    # The project's own branches, index and files are as they were; the decoy repository
    # above the worktree dir too.
    assert _project_state(project) == before
    installation.decoy_unchanged()
    tampered = case in ("own-repo", "main-gitdir", "no-dotgit")
    if tampered:
        # Nothing committed anywhere: the worktree (the agent's files) is kept, and the run
        # says why and where, on the pages and in the API.
        assert run.commit_error and run.worktree_path in run.commit_error
        assert "no longer names the run's git dir" in run.commit_error
        kept = Path(run.worktree_path or "")
        assert (kept / "agent-work-worker.txt").read_text() == "work of step worker\n"
        assert (kept / "agent-work-verifier.txt").exists()
        assert run.worktree_removed_at is None
        assert _run_branch_files(project, run) == ["README"]
    else:
        # The work is on the run's branch (and only there), committed without the
        # agent's filter: the bytes as the agent wrote them.
        assert run.commit_error is None
        files = _run_branch_files(project, run)
        assert {"agent-work-worker.txt", "agent-work-verifier.txt"} <= set(files)
        blob = inert_git(
            project,
            "cat-file",
            "blob",
            f"{worktree_branch(run.id)}:agent-work-worker.txt",
        )
        assert blob == "work of step worker\n"

    # A later run of the same project: its worktree is made (and committed) with the
    # agent's settings still in the project's config; still nothing of the agent runs.
    again = installation.route(project, "", 2)
    assert again.status == RunStatus.SUCCEEDED, again.error
    assert again.commit_error is None
    assert installation.marks() == "", installation.marks()
    assert "agent-work-worker.txt" in _run_branch_files(project, again)
    assert _project_state(project) == before
    installation.decoy_unchanged()


def test_a_run_whose_commit_is_refused_says_why_and_where_on_the_pages_and_api(
    installation: Installation, tmp_path: Path, admin_client: Any
) -> None:
    project = git_project(tmp_path / "project")
    run = installation.route(project, "main-gitdir", 3)
    assert run.commit_error
    item_page = admin_client.get(f"/ops/items/{run.work_item_id}/")
    assert item_page.status_code == 200
    assert escape(run.commit_error) in item_page.content.decode()
    run_page = admin_client.get(f"/admin/ledger/workflowrun/{run.id}/change/")
    assert escape(run.commit_error) in run_page.content.decode()
    api = admin_client.get(f"/api/v1/work-items/{run.work_item_id}")
    assert api.status_code == 200, api.content
    (found,) = [r for r in api.json()["runs"] if r["id"] == run.id]
    assert found["workNotCommitted"] == run.commit_error
    assert found["worktreePath"] == run.worktree_path


def test_a_process_the_agent_left_with_setsid_is_ended_with_its_step(
    installation: Installation, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "project")
    pids_file = installation.hostile / "pids"
    pids_file.unlink(missing_ok=True)
    run = installation.route(project, "setsid", 4)
    assert run.status == RunStatus.SUCCEEDED, run.error
    (pid,) = [int(line) for line in pids_file.read_text().split()]
    # Ended by the time the step was recorded: 0 processes left.
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    worker = steps_of(run)["worker"]
    assert worker.processes_ended == 1
    assert steps_of(run)["verifier"].processes_ended == 0


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"
