"""Several machines: two run clusters (two processes standing in for two machines) against one
PostgreSQL share the runs, and no run is executed twice."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings

from ledger.instances import WorkerId
from ledger.models import RunStatus, WorkflowEvent, WorkflowRun
from routing.admission import CREATED, route_event, route_options
from tests.ledger.runner_helpers import child_database_url
from tests.processes import (
    generic_event,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.postgres,
    # Two clusters of workers: with the installations, one at a time, on one xdist worker.
    pytest.mark.xdist_group("installation"),
]

RUNS = 20


def _worker(claimed_by: str | None) -> WorkerId:
    parsed = WorkerId.parse(claimed_by)
    assert parsed is not None, claimed_by
    return parsed


def _process_group(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def test_two_run_clusters_share_twenty_runs_and_run_each_exactly_once(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    records = tmp_path / "records"
    records.mkdir()
    # The clusters belong to the suite's installation (its key): they read the tasks this
    # process queues.
    env = terminal_env(
        Path(settings.DATA_DIR),
        SECRET_KEY=settings.SECRET_KEY,
        DATABASE_URL=child_database_url(),
        LOOPSWEB_RUN_WORKERS="3",
        FAKE_AGENT_SLEEP="1",
        FAKE_AGENT_RECORD_DIR=str(records),
    )
    # Two machines: each run cluster with its own host name (one run cluster per host
    # name; a second cluster under the same name would be taken for that host restarted).
    clusters = [
        start_qcluster(
            {**env, "LOOPSWEB_HOST_NAME": f"machine-{n}"},
            tmp_path / f"machine-{n}.log",
            cluster="loopsweb-runs",
        )
        for n in (1, 2)
    ]
    try:
        options = route_options({"max_active": RUNS})
        runs = []
        for n in range(RUNS):
            result = route_event(
                kind="generic",
                envelope=generic_event(project, n),
                options=options,
                env={},
            )
            assert result.kind == CREATED
            runs.append(result.run.id)

        def finished() -> bool:
            assert all(proc.poll() is None for proc in clusters), "a cluster died"
            open_runs = WorkflowRun.objects.filter(
                status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
            ).count()
            return open_runs == 0

        wait_until(finished, timeout=180, what="all twenty runs to finish")
        # Which machine ran each run: the worker pid's process group is its cluster's.
        claimed_by = dict(WorkflowRun.objects.values_list("id", "claimed_by"))
        machine_of = {
            run_id: _process_group(_worker(worker).pid)
            for run_id, worker in claimed_by.items()
        }
    finally:
        for proc in clusters:
            stop_process_group(proc)

    statuses = Counter(WorkflowRun.objects.values_list("status", flat=True))
    assert statuses == {RunStatus.SUCCEEDED: RUNS}
    claims = Counter(
        WorkflowEvent.objects.filter(event_type="claimed").values_list(
            "workflow_run_id", flat=True
        )
    )
    assert claims == dict.fromkeys(runs, 1)
    # Each run's two steps started exactly once each: one agent process per step.
    invocations = Counter(
        (r["env"].get("LOOPSWEB_RUN_ID"), r["env"].get("LOOPSWEB_STEP_ID"))
        for r in (json.loads(f.read_text()) for f in records.glob("*.json"))
    )
    assert len(invocations) == 2 * RUNS and set(invocations.values()) == {1}
    per_machine = Counter(machine_of.values())
    assert set(per_machine) == {proc.pid for proc in clusters}, per_machine
    assert all(count > 0 for count in per_machine.values())
