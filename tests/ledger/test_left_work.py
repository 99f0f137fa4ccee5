"""Work a run left uncommitted in its worktree is never lost: lease
recovery commits it on the run's branch; `prune_worktrees` commits what a due worktree still
holds before removing it, keeps one whose work cannot be committed, and never removes an
orphan that may hold work. Real git, the fake agent in this process;
tests/test_left_work_process.py kills a real run cluster mid-step."""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from ledger import services, tasks
from ledger.models import RunStatus, WorkflowRun
from runs.run_worktree import RunWorktree
from runs.runner import run_workflow_run
from runs.worktrees import worktree_base, worktree_branch, worktree_dir
from tests.ledger.runner_helpers import FakeAgent, git, git_project, route_generic

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _prune(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("prune_worktrees", "--keep-seconds", "0", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def _failed_run(agent: FakeAgent, project: Path) -> WorkflowRun:
    """A failed run whose worktree is kept, what its agent wrote committed at its end."""
    agent.env(write="half-done.txt", exit="3")
    run = route_generic(project, created=True).run
    assert run_workflow_run(run.id) == RunStatus.FAILED
    run.refresh_from_db()
    assert run.commit_head and Path(run.worktree_path).is_dir()
    return run


def _saved(run: WorkflowRun) -> dict[str, Any]:
    (event,) = run.events.filter(event_type="work_saved")
    assert event.payload_json is not None
    return event.payload_json


def test_lease_recovery_commits_what_the_killed_run_left_on_its_branch(
    tmp_path: Path, settings: Any
) -> None:
    project = git_project(tmp_path / "repo")
    run = route_generic(project, created=True).run
    worker = f"{settings.LOOPSWEB_HOST_NAME}:4242"  # a worker of this host, now gone
    claimed = services.run_claim(run_id=run.id, worker=worker)
    assert claimed is not None
    RunWorktree(claimed, worker).prepare(claimed.workflow.steps_json)
    # What its agent wrote before the worker died, never committed.
    (worktree_dir(run.id) / "half-done.txt").write_text("unfinished\n")
    WorkflowRun.objects.filter(pk=run.id).update(
        lease_expires_at=timezone.now() - timedelta(minutes=1)
    )

    assert tasks.recover_expired_runs() == 1
    run.refresh_from_db()
    branch = worktree_branch(run.id)
    assert run.status == RunStatus.FAILED and run.commit_error is None
    assert "half-done.txt" in run.commit_diffstat
    assert run.commit_head == git(project, "rev-parse", branch).strip()
    assert git(project, "show", f"{branch}:half-done.txt") == "unfinished\n"
    saved = _saved(run)
    assert (saved["paths"], saved["first"]) == (1, ["half-done.txt"])
    assert (saved["commit"], saved["why"]) == (run.commit_head, "after recovery")

    # Nothing is left to commit: the prune removes the worktree, the branch keeps the work.
    report = _prune()
    assert [(p["runId"], p["committed"]) for p in report["pruned"]] == [(run.id, 0)]
    assert report["kept"] == [] and not worktree_dir(run.id).exists()
    assert git(project, "show", f"{branch}:half-done.txt") == "unfinished\n"


def test_a_prune_commits_what_a_due_worktree_still_holds_before_removing_it(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    run = _failed_run(agent, project)
    path, branch = Path(run.worktree_path), worktree_branch(run.id)
    # Changed after the run's own commit (a leftover process, a recovery elsewhere).
    (path / "late.txt").write_text("written after the run ended\n")
    (path / "README").unlink()

    dry = _prune("--dry-run")
    assert [(p["runId"], p["committed"]) for p in dry["pruned"]] == [(run.id, 2)]
    assert path.exists()
    assert git(project, "rev-parse", branch).strip() == run.commit_head  # untouched
    out = io.StringIO()
    call_command("prune_worktrees", "--keep-seconds", "0", "--dry-run", stdout=out)
    assert f"(would commit 2 path(s) left on {branch} first)" in out.getvalue()

    report = _prune()
    assert [(p["runId"], p["committed"]) for p in report["pruned"]] == [(run.id, 2)]
    assert not path.exists()
    before = run.commit_head
    run.refresh_from_db()
    assert run.commit_head != before and run.worktree_removed_at is not None
    assert git(project, "show", f"{branch}:late.txt") == "written after the run ended\n"
    files = git(project, "ls-tree", "--name-only", branch).split()
    assert files == ["half-done.txt", "late.txt"]  # README's deletion is committed too
    saved = _saved(run)
    assert (saved["paths"], saved["why"]) == (2, "before its prune")


def test_a_worktree_whose_work_cannot_be_committed_is_kept_not_pruned(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    run = _failed_run(agent, project)
    path = Path(run.worktree_path)
    (path / "late.txt").write_text("unsaved\n")
    (path / ".git").rename(path / "moved-git")  # the agent broke its `.git`

    report = _prune()
    assert report["pruned"] == []
    [kept] = report["kept"]
    assert (
        kept["runId"] == run.id and "no longer names the run's git dir" in kept["kept"]
    )
    assert (path / "late.txt").read_text() == "unsaved\n"
    run.refresh_from_db()
    assert run.commit_error and run.commit_error.startswith("work not committed")
    assert run.worktree_removed_at is None
    # Recorded on the run: never due again, never removed by a prune.
    assert _prune() == {"dryRun": False, "pruned": [], "kept": [], "branches": []}
    assert path.exists()


def test_an_orphan_that_may_hold_work_is_kept_and_a_clean_one_goes(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    base = worktree_base()
    # A worktree its agent moved to a name of no run, with work in it never committed.
    run = _failed_run(agent, project)
    moved = base / f"moved-{uuid.uuid4().hex}"
    Path(run.worktree_path).rename(moved)
    (moved / "more.txt").write_text("work\n")
    # A directory that is no git worktree, an empty one, and a clean worktree of no run.
    stray, empty, clean = (base / uuid.uuid4().hex for _ in range(3))
    stray.mkdir()
    (stray / "notes.txt").write_text("someone's notes\n")
    empty.mkdir()
    git(project, "worktree", "add", "-q", "-b", worktree_branch(clean.name), str(clean))

    report = _prune("--orphans")
    kept = {k["runId"]: k["kept"] for k in report["kept"]}
    removed = {p["runId"] for p in report["pruned"]}
    assert moved.name in kept and stray.name in kept
    assert (
        "not a git worktree of a project inside LOOPSWEB_PROJECT_ROOTS"
        in (kept[stray.name])
    )
    assert {empty.name, clean.name} <= removed and not removed & set(kept)
    assert (moved / "more.txt").read_text() == "work\n"
    assert (stray / "notes.txt").exists()
    assert not empty.exists() and not clean.exists()
    assert worktree_branch(clean.name) not in git(project, "branch", "--list")
    # Kept again at the next prune: nothing of them goes without an operator.
    again = {k["runId"] for k in _prune("--orphans")["kept"]}
    assert {moved.name, stray.name} <= again and moved.exists()
