"""A hung host never freezes the others (issue 44): a run-cluster worker SIGSTOPped while it
holds the admission lock (its backend "idle in transaction") is cut off by the server after
LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS; meanwhile another machine's admission goes through, and
once the worker resumes, its run is retried where it was, not failed. Real processes on one
PostgreSQL; the agent is scripts/fake-agent."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ledger.lock import ADMISSION_KEY, ADVISORY_NAMESPACE
from ledger.models import RunStatus, WorkflowEvent, WorkflowRun
from routing.admission import CREATED, route_event, route_options
from tests.hostsim import sim_host
from tests.ledger.runner_helpers import admission_lock_held, git_project
from tests.processes import generic_event
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.postgres,
]


def _route(project: Path, n: int) -> str:
    result = route_event(
        kind="generic",
        envelope=generic_event(project, n),
        options=route_options({"max_active": 50}),
        env={},
    )
    assert result.kind == CREATED, result
    return str(result.run.id)


def _lock_rows(granted: bool) -> list[str]:
    """application_name of the sessions holding (or waiting for) the admission lock."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.application_name FROM pg_locks l"
            " JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s"
            " AND l.granted = %s AND l.database ="
            " (SELECT oid FROM pg_database WHERE datname = current_database())",
            [ADVISORY_NAMESPACE, ADMISSION_KEY, granted],
        )
        return [str(row[0]) for row in cursor.fetchall()]


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_stopped_lock_holder_is_cut_off_and_its_run_retried(tmp_path: Path) -> None:
    host = sim_host(
        tmp_path,
        "host-a",
        [tmp_path / "projects"],
        LOOPSWEB_RUN_WORKERS="1",
        FAKE_AGENT_SLEEP="2",
        LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS="2",
    )
    project = git_project(host.roots[0] / "alpha")
    host.start()
    worker = 0
    try:
        first = _route(project, 0)
        wait_for(
            lambda: WorkflowEvent.objects.filter(
                workflow_run_id=first, event_type="step_started"
            ).exists(),
            timeout=90,
            what="the first step to start",
        )
        with admission_lock_held():
            # The step's end waits for the lock: stop that worker while it waits, then let
            # the lock go, so its backend takes it and holds it for a process that is gone.
            waiting = wait_for(
                lambda: [n for n in _lock_rows(False) if n.endswith(" host-a")],
                timeout=60,
                what="host-a's worker to wait for the admission lock",
            )
            worker = int(waiting[0].split()[1])
            os.kill(worker, signal.SIGSTOP)
        wait_for(
            lambda: _lock_rows(True) == [f"loopsweb {worker} host-a"],
            what="the stopped worker's backend to hold the lock",
        )
        # Another machine's admission waits at most the idle limit, then goes through.
        second = _route(project, 1)
        assert _stopped(worker)
        assert f"loopsweb {worker} host-a" not in _lock_rows(True)
        os.kill(worker, signal.SIGCONT)
        worker = 0
        wait_for(
            lambda: (
                not WorkflowRun.objects.filter(
                    id__in=[first, second],
                    status__in=[RunStatus.QUEUED, RunStatus.RUNNING],
                ).exists()
            ),
            timeout=120,
            what="both runs to finish",
        )
    finally:
        if worker:
            os.kill(worker, signal.SIGCONT)
        host.stop()
    runs = list(WorkflowRun.objects.filter(id__in=[first, second]))
    assert {r.status for r in runs} == {RunStatus.SUCCEEDED}, [r.error for r in runs]
    claims = WorkflowEvent.objects.filter(
        workflow_run_id=first, event_type="claimed"
    ).count()
    assert claims == 1  # retried where it was: never claimed again, never failed
    assert "did not take it" in host.log_text()
