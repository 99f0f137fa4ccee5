"""The runner as its own process (`manage.py run_workflow`) against the test database.

These tests commit (`transaction=True`) so the child process sees the rows; on SQLite the test
database is a file, on PostgreSQL the child connects to the test database by name.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from ledger import services
from ledger.instances import WorkerId
from ledger.models import (
    LoopStatus,
    RunStatus,
    SpecStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkItemStatus,
)
from ledger.selectors import account_load
from routing.admission import CREATED, THROTTLED, route_event, route_options
from tests.ledger.runner_helpers import (
    VENV_BIN,
    admit_workflow,
    agent_step,
    kill_group_quietly,
    process_alive,
    spawn_runner,
    steps_of,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _event(project: Path, n: int) -> dict[str, Any]:
    return {
        "id": f"evt-kill-{n}-{time.time_ns()}",
        "type": "build.failed",
        "source": "ci",
        "data": {
            "project_path": str(project),
            "title": f"Fix {n}",
            "message": "broken",
        },
    }


def _child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    records = tmp_path / "agent-records"
    records.mkdir(exist_ok=True)
    env = {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_AGENT_RECORD_DIR": str(records),
        "LOOPSWEB_KILL_GRACE_SECONDS": "0",
        "LOOPSWEB_STEP_START_POLL_SECONDS": "1",
    }
    env.update(extra)
    return env


def _running_step(run: WorkflowRun, step_id: str) -> WorkflowStepRun | None:
    step = WorkflowStepRun.objects.get(workflow_run=run, step_id=step_id)
    return step if step.status == StepStatus.RUNNING and step.pid else None


def test_a_sigkilled_worker_is_recovered_after_its_lease_and_the_next_item_is_admitted(
    tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_KILL_GRACE_SECONDS = 0.5
    options = route_options({"auth_profile": "acctA", "max_active": 1})
    first = route_event(
        kind="generic", envelope=_event(tmp_path, 1), options=options, env={}
    )
    assert first.kind == CREATED
    run = first.run
    child = spawn_runner(
        run.id,
        extra_env=_child_env(
            tmp_path,
            LOOPSWEB_RUN_LEASE_SECONDS="1",
            FAKE_AGENT_SLEEP="60",
            FAKE_AGENT_TICK="0.2",
            LOOPSWEB_OUTPUT_FLUSH_SECONDS="1",
        ),
    )
    agent_pid = None
    try:
        step = wait_for(
            lambda: _running_step(run, "worker"), what="the worker step to run"
        )
        agent_pid = step.pid
        # Its output reaches the step run while it runs (LOOPSWEB_OUTPUT_FLUSH_SECONDS).
        wait_for(
            lambda: "FAKE_AGENT_ARGV" in (steps_of(run)["worker"].stdout or ""),
            what="the worker's output in its step run",
        )
        assert account_load().running == {"acctA": 1}
        # The cap slot is taken: the next event waits.
        blocked = route_event(
            kind="generic", envelope=_event(tmp_path, 2), options=options, env={}
        )
        assert blocked.kind == THROTTLED

        # The agent's stdout is a pipe to the runner: an agent still starting up when its
        # runner dies fails on its first line (broken pipe). Kill the runner once the agent
        # has printed it and written its record, i.e. is in its 60 s of work.
        records = tmp_path / "agent-records"
        wait_for(lambda: any(records.glob("*.json")), what="the agent's record")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        # The step does not outlive its worker: its guard (agents.stepguard) is told of the
        # worker's death (PR_SET_PDEATHSIG) and ends the agent.
        wait_for(
            lambda: not process_alive(agent_pid), what="the step to end with its worker"
        )

        run.refresh_from_db()
        lease = run.lease_expires_at
        assert run.status == RunStatus.RUNNING and lease is not None
        # Before the lease expires nothing is recovered; after it, the run is.
        assert (
            services.runs_recover_expired(now=lease - timedelta(milliseconds=1)) == []
        )
        wait_for(lambda: timezone.now() > lease, what="the lease to expire")
        (recovered,) = services.runs_recover_expired()

        assert recovered.run_id == run.id and recovered.failed_steps == ["worker"]
        assert recovered.killed_pids == []  # nothing of the step was left to kill
        run.refresh_from_db()
        assert run.status == RunStatus.FAILED
        assert run.error == (
            f"workflow run lease expired before completion (claimed_by={run.claimed_by})"
        )
        worker = WorkerId.parse(run.claimed_by)
        assert worker is not None and worker.pid == child.pid
        steps = steps_of(run)
        assert steps["worker"].status == StepStatus.FAILED
        assert steps["worker"].error == (
            f"worker lease expired before completion (claimed_by={run.claimed_by})"
        )
        assert steps["verifier"].status == StepStatus.SKIPPED
        item = run.work_item
        item.refresh_from_db()
        assert item.status == WorkItemStatus.FAILED
        assert item.last_reason == "parent loop run lease expired before completion"
        run.loop.refresh_from_db()
        assert run.loop.status == LoopStatus.STOPPED
        run.workflow.refresh_from_db()
        assert run.workflow.status == SpecStatus.ARCHIVED
        # The account and the cap slot are free again: the waiting item is admitted.
        assert account_load().total() == {}
        again = route_event(
            kind="generic", envelope=blocked.event, options=options, env={}
        )
        assert again.kind == CREATED
        assert steps_of(again.run)["worker"].account_profile == "acctA"
    finally:
        kill_group_quietly(child.pid if child.poll() is None else None)
        kill_group_quietly(agent_pid)


def test_cancelling_a_running_run_stops_its_worker_and_the_agent(
    tmp_path: Path,
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    child = spawn_runner(
        run.id,
        extra_env=_child_env(
            tmp_path,
            LOOPSWEB_RUN_LEASE_SECONDS="1",
            FAKE_AGENT_SLEEP="60",
            FAKE_AGENT_TICK="0.2",
            LOOPSWEB_OUTPUT_FLUSH_SECONDS="1",
        ),
    )
    agent_pid = None
    try:
        step = wait_for(
            lambda: _running_step(run, "worker"), what="the worker step to run"
        )
        agent_pid = step.pid
        # Its output reaches the step run while it runs (LOOPSWEB_OUTPUT_FLUSH_SECONDS).
        wait_for(
            lambda: "FAKE_AGENT_ARGV" in (steps_of(run)["worker"].stdout or ""),
            what="the worker's output in its step run",
        )

        services.run_cancel(run_id=run.id, reason="operator stop")

        _, stderr = child.communicate(timeout=60)
        assert child.returncode != 0
        assert f"run {run.id} was taken from this worker: cancelled" in stderr
        wait_for(lambda: not process_alive(agent_pid), what="the agent to be killed")
        run.refresh_from_db()
        assert run.status == RunStatus.CANCELLED and run.error == "operator stop"
        assert steps_of(run)["worker"].status == StepStatus.CANCELLED
        # The tail is kept on cancel: what the agent printed before it was stopped.
        assert "FAKE_AGENT_ARGV" in (steps_of(run)["worker"].stdout or "")
        run.work_item.refresh_from_db()
        assert run.work_item.status == WorkItemStatus.CANCELLED
        assert account_load().total() == {}
    finally:
        kill_group_quietly(child.pid if child.poll() is None else None)
        kill_group_quietly(agent_pid)


def test_a_worker_at_the_account_cap_waits_and_starts_when_a_slot_frees(
    tmp_path: Path,
) -> None:
    blocker = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    services.run_claim(run_id=blocker.id, worker="other-host:1")
    blocker_step = steps_of(blocker)["worker"]
    services.step_start(step_run_id=blocker_step.id, worker="other-host:1")
    run = admit_workflow(
        [agent_step("worker", cwd=tmp_path, profile="acctA", max_per_profile=1)]
    )
    child = spawn_runner(
        run.id,
        extra_env=_child_env(tmp_path, LOOPSWEB_RUN_LEASE_SECONDS="3"),
    )
    try:
        wait_for(
            lambda: run.events.filter(event_type="step_waiting").exists(),
            what="the step to wait for its account",
        )
        time.sleep(0.3)
        step = steps_of(run)["worker"]
        assert step.status == StepStatus.PENDING
        # It keeps its lease while it waits.
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and run.lease_expires_at > timezone.now()

        freed_at = timezone.now()
        services.step_finish(
            step_run_id=blocker_step.id, status=StepStatus.SUCCEEDED, exit_code=0
        )

        stdout, stderr = child.communicate(timeout=60)
        assert child.returncode == 0, stderr
        assert stdout.strip() == f"run {run.id} succeeded"
        step.refresh_from_db()
        assert step.status == StepStatus.SUCCEEDED and step.started_at >= freed_at
        assert run.events.filter(event_type="step_waiting").count() == 1
    finally:
        kill_group_quietly(child.pid if child.poll() is None else None)


def test_sigterm_to_the_worker_kills_the_agent_and_fails_the_run_at_once(
    tmp_path: Path,
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    child = spawn_runner(run.id, extra_env=_child_env(tmp_path, FAKE_AGENT_SLEEP="60"))
    agent_pid = None
    try:
        step = wait_for(
            lambda: _running_step(run, "worker"), what="the worker step to run"
        )
        agent_pid = step.pid

        os.kill(child.pid, signal.SIGTERM)

        child.communicate(timeout=60)
        assert child.returncode == 128 + signal.SIGTERM
        assert not process_alive(agent_pid)
        run.refresh_from_db()
        assert run.status == RunStatus.FAILED
        assert run.error == "runner stopped before the run finished"
        assert steps_of(run)["worker"].status == StepStatus.FAILED
        run.work_item.refresh_from_db()
        assert run.work_item.status == WorkItemStatus.FAILED
    finally:
        kill_group_quietly(child.pid if child.poll() is None else None)
        kill_group_quietly(agent_pid)
