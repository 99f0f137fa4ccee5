"""A per-minute limit pauses on its account, through the real processes
(ledger.services.failover rule 7): a task drained over a pool of two registered codex
accounts (`manage.py drain` in a second terminal) runs in the run cluster (`manage.py
qcluster`, the fake agent as codex); its worker answers one 429 with `Retry-After: 3`, the
run is parked for the reset (handed back, holding no worker) and the step runs again on the
SAME account, where the run succeeds: no move, the pool is not rotated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from ledger.models import WorkflowEvent, WorkflowRun, WorkflowWorkItem
from ledger.services.failover import ACCOUNT_PAUSED_CODE
from tests.ledger.account_failover_helpers import attempts_of
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


def test_a_per_minute_429_waits_on_its_account_in_the_run_cluster(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "project")
    config = tmp_path / "agent.json"
    once = tmp_path / "limited-once"
    limited = {"rate_limit": "HTTP 429 Too Many Requests. Retry-After: 3"}
    config.write_text(
        json.dumps({"steps": {"worker": {**limited, "exit_once": str(once)}}})
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
    event.write_text(json.dumps(todos_event("PAUSE-1", project=str(project))))
    manage(env, "ingest_events", str(event))
    drained = manage(
        env,
        "drain",
        "todos-task",
        "--provider",
        "codex",
        "--auth-profile-pool",
        "cx-a,cx-b",
        "--json",
    )
    assert '"created": 1' in drained.stdout, drained.stdout
    log = tmp_path / "runs.log"
    cluster = start_qcluster(env, log, cluster="loopsweb-runs")
    main_log = tmp_path / "main.log"
    main = start_qcluster(env, main_log)
    try:
        done = wait_until(
            lambda: _ended([(cluster, log), (main, main_log)]),
            what="the item to end after its pause",
        )
    finally:
        stop_process_group(main)
        stop_process_group(cluster)
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
    tried = [json.loads(p.read_text()) for p in sorted(records.iterdir())]
    assert [(r["step"], r["profile"]) for r in tried][:2] == [
        ("worker", first),
        ("worker", first),
    ]
