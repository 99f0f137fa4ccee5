"""Exit 75 ("try later") through the real processes (issue 58): a task drained over a pool
of two registered codex accounts runs in the run cluster (`manage.py qcluster`, the fake
agent as codex); its worker exits 75 the first time, and the run cluster runs the item again
after the route's backoff, where it succeeds with its one attempt refunded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from ledger.models import WorkflowEvent, WorkflowRun, WorkflowWorkItem
from tests.ledger.runner_helpers import child_database_url, git_project
from tests.processes import (
    manage,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)
from tests.routing.helpers import todos_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _ended(clusters: list[tuple[Any, Path]]) -> WorkflowWorkItem | None:
    for cluster, log in clusters:
        assert cluster.poll() is None, log.read_text()[-3000:]
    return WorkflowWorkItem.objects.filter(
        status__in=("succeeded", "failed", "dead_letter", "cancelled")
    ).first()


def test_a_worker_that_exits_75_once_runs_again_and_succeeds(tmp_path: Path) -> None:
    project = git_project(tmp_path / "project")
    config = tmp_path / "agent.json"
    once = tmp_path / "exited-75"
    config.write_text(
        json.dumps({"steps": {"worker": {"exit": 75, "exit_once": str(once)}}})
    )
    records = tmp_path / "records"
    records.mkdir()
    env = terminal_env(
        Path(settings.DATA_DIR),
        SECRET_KEY=settings.SECRET_KEY,
        DATABASE_URL=child_database_url(),
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*",
        FAKE_AGENT_CONFIG=str(config),
        FAKE_AGENT_RECORD_DIR=str(records),
    )
    for name in ("cx-a", "cx-b"):
        manage(env, "account", "add", name, "--provider", "codex")
    event = tmp_path / "task.json"
    event.write_text(json.dumps(todos_event("LATER-1", project=str(project))))
    manage(env, "ingest_events", str(event))
    drained = manage(
        env,
        "drain",
        "todos-task",
        "--provider",
        "codex",
        "--auth-profile-pool",
        "cx-a,cx-b",
        "--retry-backoff",
        "1",
        "--json",
    )
    assert '"created": 1' in drained.stdout, drained.stdout
    log = tmp_path / "runs.log"
    cluster = start_qcluster(env, log, cluster="loopsweb-runs")
    # The main cluster fires the one-off schedule that hands the later run over.
    main_log = tmp_path / "main.log"
    main = start_qcluster(env, main_log)
    try:
        done = wait_until(
            lambda: _ended([(cluster, log), (main, main_log)]),
            what="the item to end after its try later",
        )
    finally:
        stop_process_group(main)
        stop_process_group(cluster)
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
    steps = [json.loads(p.read_text())["step"] for p in sorted(records.iterdir())]
    assert steps == ["worker", "worker", "verifier"]
