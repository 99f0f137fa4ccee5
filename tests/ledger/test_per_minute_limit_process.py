"""A per-minute limit pauses on its account, through the real processes
(ledger.services.failover rule 7): a task drained over a pool of two registered codex
accounts (`manage.py drain` in a second terminal) runs in the run cluster (`manage.py
qcluster`, the fake agent as codex); its worker answers one 429 with `Retry-After: 3`, the
run is parked for the reset (handed back, holding no worker) and the step runs again on the
SAME account, where the run succeeds: no move, the pool is not rotated."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.models import WorkflowEvent, WorkflowRun
from ledger.services.failover import ACCOUNT_PAUSED_CODE
from tests.ledger.account_failover_helpers import attempts_of
from tests.ledger.drained_pool import drain_one_task
from tests.ledger.runner_helpers import git_project

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_per_minute_429_waits_on_its_account_in_the_run_cluster(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "project")
    once = tmp_path / "limited-once"
    limited = {"rate_limit": "HTTP 429 Too Many Requests. Retry-After: 3"}
    done, tried = drain_one_task(
        tmp_path,
        project,
        {"steps": {"worker": {**limited, "exit_once": str(once)}}},
        what="the item to end after its pause",
    )
    (run,) = WorkflowRun.objects.filter(work_item_id=done.id)
    assert done.status == "succeeded", run.error
    assert once.exists()  # the worker did answer the 429 once
    worker = [a for a in attempts_of(run) if a[1] != "running"]
    first = worker[0][0]
    assert worker[:2] == [(first, "rate_limited"), (first, "succeeded")], worker
    assert not WorkflowEvent.objects.filter(
        workflow_run=run, event_type="step_account_moved", step_id="worker"
    ).exists()
    paused = WorkflowEvent.objects.get(
        workflow_run=run,
        event_type="step_waiting",
        payload_json__code=ACCOUNT_PAUSED_CODE,
    )
    assert f"account {first} answered a per-minute rate limit" in (
        paused.payload_json or {}
    ).get("reason", "")
    # The worker's two tries on one account (the second after the reset), then the
    # verifier on the other (worker ≠ verifier).
    assert [(r["step"], r["profile"]) for r in tried][:2] == [
        ("worker", first),
        ("worker", first),
    ]
