"""Retry keeps the route, with the real processes (issue 39): a task drained as provider codex
over a pool of two registered accounts fails in the run cluster (`manage.py qcluster`, the
fake agent as codex); `manage.py routes retry` re-admits it, and the run cluster runs it
again on codex over the same pool and scope, as the ledger and the agent's own records show.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings

from ledger.models import WorkflowRun, WorkflowStepRun, WorkflowWorkItem
from tests.ledger.runner_helpers import child_database_url, git_project
from tests.processes import (
    manage,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

POOL = ("cx-a", "cx-b")


def _item_status(status: str, cluster, log: Path) -> WorkflowWorkItem | None:
    assert cluster.poll() is None, log.read_text()[-3000:]
    return WorkflowWorkItem.objects.filter(status=status).first()


def _steps(run_id: str | None) -> set[tuple[str | None, str | None]]:
    return set(
        WorkflowStepRun.objects.filter(workflow_run_id=run_id).values_list(
            "account_tool", "account_profile"
        )
    )


def test_a_failed_item_retried_by_the_command_runs_again_on_its_provider_and_pool(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "project")
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"default": {"exit": 1}}))  # the first attempt fails
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
    for name in POOL:
        manage(env, "account", "add", name, "--provider", "codex")
    event = tmp_path / "task.json"
    event.write_text(
        json.dumps(
            {
                "id": "evt-retry-1",
                "type": "task.created",
                "source": "@hasna/todos",
                "data": {
                    "id": "RETRY-1",
                    "title": "Fix the build",
                    "tags": ["auto:route"],
                    "project_path": str(project),
                },
            }
        )
    )
    manage(env, "ingest_events", str(event))
    drained = manage(
        env,
        "drain",
        "todos-task",
        "--provider",
        "codex",
        "--auth-profile-pool",
        ",".join(POOL),
        "--max-per-profile",
        "1",
        "--max-active-scope",
        "night",
        "--json",
    )
    assert '"created": 1' in drained.stdout, drained.stdout
    log = tmp_path / "runs.log"
    cluster = start_qcluster(env, log, cluster="loopsweb-runs")
    try:
        failed = wait_until(
            lambda: _item_status("failed", cluster, log), what="the first run to fail"
        )
        first_run = failed.workflow_run_id
        assert {tool for tool, _ in _steps(first_run)} == {"codex"}
        config.write_text(json.dumps({"default": {"exit": 0}}))  # the retry succeeds

        retried = manage(env, "routes", "retry", failed.id)

        assert "admitted again" in retried.stdout, retried.stdout
        done = wait_until(
            lambda: _item_status("succeeded", cluster, log),
            what="the retried run to succeed",
        )
    finally:
        stop_process_group(cluster)
    assert (done.id, done.attempts, done.route_scope) == (failed.id, 2, "night")
    assert done.workflow_run_id != first_run
    second = WorkflowRun.objects.get(pk=done.workflow_run_id)
    assert second.status == "succeeded"
    assert {tool for tool, _ in _steps(second.id)} == {"codex"}
    assert {profile for _, profile in _steps(second.id)} == set(POOL)
    # The agent itself ran as the pool's accounts, for both runs.
    seen = [json.loads(p.read_text()) for p in sorted(records.iterdir())]
    assert len(seen) >= 3  # the first run's worker, the second's worker and verifier
    assert {record.get("profile") for record in seen} <= set(POOL)
    # `drain todos-task` with none of the options has nothing left to route.
    again = manage(env, "drain", "todos-task", "--json")
    assert '"created": 0' in again.stdout, again.stdout
