"""The runner's time limits and live output, with the fake agent (runs.agent_step):
defaults from the settings, the route's options, the task's Q_TIMEOUT, the output flushed
while a step runs, and a run that changed nothing says so."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from ledger import services
from ledger.models import RunStatus, StepStatus, WorkflowRun, WorkflowStepRun
from routing.admission import CREATED, route_event, route_options
from runs.runner import run_workflow_run
from tests.ledger.runner_helpers import FakeAgent, git_project, steps_of
from tests.waiting import hang_deadline

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _route(project: Path, **raw: Any) -> WorkflowRun:
    event = {
        "id": f"evt-{time.time_ns()}",
        "type": "build.failed",
        "source": "ci",
        "data": {"project_path": str(project), "title": "Fix", "message": "broken"},
    }
    result = route_event(
        kind="generic", envelope=event, options=route_options(raw), env={}
    )
    assert result.kind == CREATED, result.to_dict()
    return result.run


def test_an_agent_step_without_limits_gets_the_settings_idle_timeout(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS = 1
    # It prints its argv, then nothing; by itself it would end after a hang deadline.
    agent.env(sleep=str(round(hang_deadline(120))))
    run = _route(tmp_path)
    assert run_workflow_run(run.id) == RunStatus.TIMED_OUT
    worker = steps_of(run)["worker"]
    assert worker.error.startswith("no progress for 1.0 s (idle limit)")
    # The last thing it printed, and its output so far.
    assert "; last output: FAKE_AGENT_ARGV" in worker.error
    assert "FAKE_AGENT_ARGV" in worker.stdout


def test_the_routes_step_timeout_is_rendered_into_every_agent_step(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = _route(tmp_path, step_timeout="2", step_idle_timeout=90)
    for spec in services.steps_from_spec(run.workflow.steps_json):
        assert (spec["timeoutMs"], spec["idleTimeoutMs"]) == (2000, 90_000)
    agent.env(sleep="30", tick="0.2")  # chatty: only the total limit applies
    assert run_workflow_run(run.id) == RunStatus.TIMED_OUT
    assert steps_of(run)["worker"].error.startswith("step timed out after 2000 ms")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"step_timeout": 0}, "--step-timeout must be a positive integer"),
        ({"step_idle_timeout": "10 min"}, "--step-idle-timeout must be"),
        ({"step_timeout": 30 * 86_400 + 1}, "--step-timeout must be at most 2592000"),
    ],
)
def test_bad_step_limits_are_refused_naming_the_option(
    raw: dict[str, Any], message: str
) -> None:
    from domain.errors import ValidationError

    with pytest.raises(ValidationError, match=message):
        route_options(raw)


def test_a_run_about_to_reach_q_timeout_stops_its_step_and_says_so(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.Q_TIMEOUT = (
        12  # the margin is at most half of it: the step stops after 6 s
    )
    agent.env(sleep="60", tick="0.2")
    run = _route(tmp_path)
    handed: list[tuple[str, float]] = []
    # As the django-q2 task calls it (with hand_back): the task's deadline applies, and the
    # step (60 s of ticks by itself) is stopped at it.
    status = run_workflow_run(run.id, hand_back=lambda r, d: handed.append((r, d)))
    assert status == RunStatus.TIMED_OUT
    run.refresh_from_db()
    worker = steps_of(run)["worker"]
    assert worker.status == StepStatus.TIMED_OUT
    assert worker.error.startswith("Q_TIMEOUT reached"), worker.error
    assert "Q_TIMEOUT reached" in run.error
    assert "FAKE_AGENT_TICK" in worker.stdout or worker.stdout  # the output seen so far


@pytest.mark.django_db(transaction=True)
def test_a_running_steps_output_is_flushed_every_few_seconds_and_only_when_new(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_OUTPUT_FLUSH_SECONDS = 1
    agent.configure(steps={"worker": {"sleep": 4, "tick": 0.3}})
    run = _route(tmp_path)
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        try:
            while not done.is_set():
                step = WorkflowStepRun.objects.filter(
                    workflow_run_id=run.id, step_id="worker"
                ).first()
                if step and step.status == StepStatus.RUNNING and step.stdout:
                    seen.append(step.stdout)
                time.sleep(0.2)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    finally:
        done.set()
        watcher.join()
    assert seen, "the worker's output never reached its step run while it ran"
    assert len(set(seen)) >= 2  # it grew: flushed more than once


def test_a_run_that_changed_nothing_says_so(agent: FakeAgent, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    run = _route(project)
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    assert run.commit_head and run.commit_diffstat == ""
    from ledger.display import commit_text

    assert commit_text(run) == "no changes: the run left the project as it was"


def test_output_that_shows_no_progress_does_not_keep_an_agent_alive(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    """As codex (a CLI whose JSON events tell progress apart), the agent prints a line every
    0.1 s that is no model answer or tool call, as a CLI that retries or logs does: the idle
    limit still ends it (a CLI whose output is not known is kept alive by any output: the
    chatty agent of the test above)."""
    settings.LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS = 1
    agent.env(sleep=str(round(hang_deadline(120))), tick="0.1")
    run = _route(git_project(tmp_path / "project"), provider="codex")
    assert run_workflow_run(run.id) == RunStatus.TIMED_OUT
    worker = steps_of(run)["worker"]
    assert worker.error == (
        "no progress for 1.0 s (idle limit); no progress since the step started"
    ), worker.error
    assert worker.stdout.count("fake-agent working") >= 2  # it kept printing all along
    assert worker.progress_at is None
