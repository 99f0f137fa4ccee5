"""Exit 75 ("try later") through the real processes (issue 58): a task drained over a pool
of two registered codex accounts runs in the run cluster (`manage.py qcluster`, the fake
agent as codex); its worker exits 75 the first time, and the run cluster runs the item again
after the route's backoff, where it succeeds with its one attempt refunded."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.models import WorkflowEvent, WorkflowRun
from tests.ledger.drained_pool import drain_one_task
from tests.ledger.runner_helpers import git_project

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_worker_that_exits_75_once_runs_again_and_succeeds(tmp_path: Path) -> None:
    project = git_project(tmp_path / "project")
    once = tmp_path / "exited-75"
    done, tried = drain_one_task(
        tmp_path,
        project,
        {"steps": {"worker": {"exit": 75, "exit_once": str(once)}}},
        "--retry-backoff",
        "1",
        what="the item to end after its try later",
    )
    runs = WorkflowRun.objects.filter(work_item_id=done.id).order_by("id")
    assert done.status == "succeeded", [(r.status, r.error) for r in runs]
    assert once.exists()  # the worker did exit 75 once
    assert done.attempts == 1  # no new admission: the attempt was refunded
    first, second = runs
    assert (first.status, second.status) == ("failed", "succeeded")
    assert first.error == "step worker: the agent asked to try later (exit 75)"
    later = WorkflowEvent.objects.get(workflow_run=first, event_type="step_try_later")
    assert later.payload_json is not None
    assert later.payload_json["retryRunId"] == second.id
    assert done.workflow_run_id == second.id
    assert [r["step"] for r in tried] == ["worker", "worker", "verifier"]
