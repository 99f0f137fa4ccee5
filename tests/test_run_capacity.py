"""Runs at the concurrency the caps allow, with the processes `make run` starts.

The web server, the main cluster (drains, schedules, recovery; Q_WORKERS) and the run cluster
(agent runs; LOOPSWEB_RUN_WORKERS) run for real against the test database; the fake agent
stands in for the agents. The ledger says what ran when.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.utils import timezone
from django_q.models import Task

from ledger.capacity import run_capacity
from ledger.models import RunStatus, StepStatus, WorkflowRun, WorkflowStepRun
from routing.api.tokens import api_token_create
from tests.ledger.runner_helpers import start_installation
from tests.processes import (
    free_port,
    generic_event,
    http,
    manage,
    max_overlap,
    stop_make_run,
    wait_for_http,
    wait_until,
)

# A whole installation (web server, both clusters) in its own xdist group: its agents sleep
# through most of its minute, so it runs beside the other installations' group, not in it.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.xdist_group("installation_capacity"),
]

# Long enough that six runs hold every run worker across a whole scheduler period (django-q2
# looks at schedules every 30 s), so the scheduled drain below must fire while they do.
STEP_SECONDS = 16


def _finished_runs() -> list[WorkflowRun]:
    runs = list(WorkflowRun.objects.all())
    done = [r for r in runs if r.status not in (RunStatus.QUEUED, RunStatus.RUNNING)]
    return runs if len(runs) == 7 and len(done) == 7 else []


def test_make_run_executes_runs_up_to_the_caps_and_drains_still_fire_on_time(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    port = free_port()
    _, token = api_token_create(name="capacity", scopes=["ingest"])
    env, log, proc = start_installation(
        tmp_path,
        port,
        Q_WORKERS="2",
        LOOPSWEB_RUN_WORKERS="6",
        FAKE_AGENT_SLEEP=str(STEP_SECONDS),
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/admin/login/", timeout=90)

        status, answer = http(
            f"{base}/api/v1/events?route=now&max_active=6",
            token=token,
            body=[generic_event(project, n) for n in range(6)],
        )
        assert status == 202, answer
        assert [r["kind"] for r in answer["results"]] == ["created"] * 6
        # A seventh from another process, beside the web server.
        event_file = tmp_path / "seventh.json"
        event_file.write_text(json.dumps(generic_event(project, 7)))
        routed = manage(
            env,
            "route_event",
            "generic",
            "--event-file",
            str(event_file),
            "--max-active",
            "7",
            "--json",
        )
        assert json.loads(routed.stdout)["kind"] == "created"

        # Every run worker busy: six steps running at once.
        wait_until(
            lambda: (
                WorkflowStepRun.objects.filter(status=StepStatus.RUNNING).count() >= 6
            ),
            timeout=90,
            what="six steps running at once",
        )
        # /ops/ capacity: the run cluster's six workers reported themselves, all busy.
        capacity = wait_until(
            lambda: (
                (c := run_capacity(now=timezone.now())).workers == 6
                and c.busy == 6
                and c
            ),
            timeout=30,
            what="six busy run workers on /ops/",
        )
        assert [c.cluster for c in capacity.clusters] == ["loopsweb-runs"]
        scheduled = manage(
            env,
            "schedule_drain",
            "tick",
            "generic",
            "--every",
            "1m",
            "--max-active",
            "6",
        )
        assert "scheduled drain tick" in scheduled.stdout
        from django_q.models import Schedule

        due = Schedule.objects.get(name="tick").next_run
        drain_task = wait_until(
            lambda: Task.objects.filter(group="tick").first(),
            timeout=90,
            what="the scheduled drain to run",
        )
        runs = wait_until(_finished_runs, timeout=240, what="all seven runs to finish")
    finally:
        stop_make_run(proc)
    output = log.read_text(errors="replace")
    assert "BadSignature" not in output and "Failed to push" not in output

    assert {r.status for r in runs} == {RunStatus.SUCCEEDED}, [
        (r.status, r.error) for r in runs
    ]
    steps = list(WorkflowStepRun.objects.all())
    assert len(steps) == 14 and {s.status for s in steps} == {StepStatus.SUCCEEDED}
    intervals = [(s.started_at.timestamp(), s.finished_at.timestamp()) for s in steps]
    assert max_overlap(intervals) >= 5

    # The drain fired once it was due and ran from start to end while runs held all six
    # run workers: the main cluster does not wait for the run cluster's work.
    assert drain_task.success, drain_task.result
    assert due <= drain_task.started <= drain_task.stopped
    busy = [
        s
        for s in steps
        if s.started_at <= drain_task.started and s.finished_at >= drain_task.stopped
    ]
    assert len(busy) >= 6
