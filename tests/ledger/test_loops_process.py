"""Loop actions and retries as operators run them: `manage.py loop` and `manage.py
run_workflow` as real processes with the fake agent, against the test database."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ledger.models import (
    Loop,
    LoopStatus,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.selectors import account_load
from tests.ledger.runner_helpers import (
    VENV_BIN,
    admit_workflow,
    agent_step,
    child_database_url,
    kill_group_quietly,
    process_alive,
    route_created,
    spawn_runner,
    wait_for,
)
from tests.processes import manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    records = tmp_path / "agent-records"
    records.mkdir(exist_ok=True)
    return {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_AGENT_RECORD_DIR": str(records),
        "LOOPSWEB_KILL_GRACE_SECONDS": "0",
        "LOOPSWEB_STEP_START_POLL_SECONDS": "1",
        **extra,
    }


def _manage_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=child_database_url(),
        LOOPSWEB_TESTING="1",
        LOOPSWEB_KILL_GRACE_SECONDS="0",
    )
    return env


def _running_step(run: WorkflowRun) -> WorkflowStepRun | None:
    step = WorkflowStepRun.objects.get(workflow_run=run, step_id="worker")
    return step if step.status == StepStatus.RUNNING and step.pid else None


@pytest.mark.parametrize(
    ("action", "item_status", "loop_status"),
    [
        ("pause", WorkItemStatus.DEFERRED, LoopStatus.PAUSED),
        ("stop", WorkItemStatus.CANCELLED, LoopStatus.STOPPED),
    ],
)
def test_the_loop_command_stops_a_running_run_cleanly(
    tmp_path: Path, action: str, item_status: str, loop_status: str
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    child = spawn_runner(run.id, extra_env=_child_env(tmp_path, FAKE_AGENT_SLEEP="60"))
    agent_pid = None
    try:
        step = wait_for(lambda: _running_step(run), what="the worker step to run")
        agent_pid = step.pid
        assert account_load().total() == {"acctA": 1}

        done = manage(_manage_env(), "loop", action, str(run.loop_id), "--json")
        report = json.loads(done.stdout)
        assert report["cancelledRuns"] == [run.id] and report["killedPids"] == [
            agent_pid
        ]

        # The agent's process group is gone, the runner gives the run up, nothing holds acctA.
        wait_for(lambda: not process_alive(agent_pid), what="the agent to be killed")
        child.communicate(timeout=60)
        reason = f"loop {'paused' if action == 'pause' else 'stopped'}"
        run.refresh_from_db()
        assert run.status == RunStatus.CANCELLED and run.error == reason
        item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
        assert item.status == item_status and item.last_reason == reason
        assert Loop.objects.get(pk=run.loop_id).status == loop_status
        assert account_load().total() == {}
    finally:
        kill_group_quietly(child.pid if child.poll() is None else None)
        kill_group_quietly(agent_pid)


def test_retries_run_through_the_runner_process_until_an_attempt_succeeds(
    tmp_path: Path,
) -> None:
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"steps": {"worker": {"exit": 5}}}))
    result = route_created(
        tmp_path,
        title="Fix",
        message="flaky",
        auth_profile="acctA",
        max_attempts="3",
        retry_backoff="0",
    )
    item_id = result.work_item.id
    env = _child_env(tmp_path, FAKE_AGENT_CONFIG=str(config))
    statuses = []
    for attempt in range(3):
        if attempt == 2:
            config.write_text(json.dumps({}))  # the third attempt's agent succeeds
        run_id = WorkflowWorkItem.objects.get(pk=item_id).workflow_run_id
        assert run_id is not None
        child = spawn_runner(run_id, extra_env=env)
        child.communicate(timeout=120)
        statuses.append(WorkflowRun.objects.get(pk=run_id).status)
    assert statuses == [RunStatus.FAILED, RunStatus.FAILED, RunStatus.SUCCEEDED]
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert item.status == WorkItemStatus.SUCCEEDED and item.attempts == 1
    assert WorkflowRun.objects.filter(work_item_id=item_id).count() == 3
