"""A database outage while runs run (issue 43 #3), on a private PostgreSQL server the test
really stops (tests/pgserver.py): a run cluster whose agents end while the database is away
records each run's commit and outcome once it is back, and it and the main cluster say so
without a traceback or a django-q2 process that dies."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.hostsim import host_env, sim_host
from tests.ledger.runner_helpers import git_project
from tests.pgserver import PrivateServer, private_server
from tests.processes import (
    generic_event,
    manage,
    start_qcluster,
    stop_process_group,
    wait_until,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
RUNS = 3
OUTAGE_SECONDS = 20


@pytest.fixture
def server() -> Iterator[PrivateServer]:
    with private_server() as pg:
        yield pg


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def test_runs_ending_during_an_outage_record_their_commit_when_it_is_back(
    server: PrivateServer, tmp_path: Path
) -> None:
    url = server.create_database("runs_outage")
    shared = tmp_path / "shared"
    host = sim_host(
        tmp_path,
        "host-o",
        [shared],
        LOOPSWEB_RUN_WORKERS=str(RUNS),
        FAKE_AGENT_WRITE="made-by-agent.txt",
    )
    # The worker step ends at once; the verifier, each run's last, in the middle of the
    # outage: the run's commit and end are written while the database is away.
    config = tmp_path / "fake-agent.json"
    config.write_text(
        json.dumps({"default": {"sleep": 0}, "steps": {"verifier": {"sleep": 8}}})
    )
    host.env["FAKE_AGENT_CONFIG"] = str(config)
    host.env["DATABASE_URL"] = url
    manage(host.env, "migrate", "--noinput", "-v0", timeout=300)
    events = tmp_path / "events.jsonl"
    project = git_project(shared / "theta")
    events.write_text(
        "".join(json.dumps(generic_event(project, n)) + "\n" for n in range(RUNS))
    )
    manage(host.env, "ingest_events", str(events), timeout=120)
    manage(host.env, "drain", "generic", "--max-dispatch", str(RUNS), timeout=120)
    # The main cluster too (schedules: recovery every minute, its scheduler and monitor).
    manage(host.env, "sync_schedules", timeout=120)
    main_env = {**host_env(tmp_path / "main", "main", []), "DATABASE_URL": url}
    main_log = tmp_path / "main-cluster.log"
    main = start_qcluster(main_env, main_log)
    host.start()
    try:
        wait_until(
            lambda: (
                _rows(
                    url,
                    "SELECT count(*) FROM workflow_step_runs"
                    " WHERE status = 'running' AND step_id = 'verifier'",
                )
                == [(RUNS,)]
            ),
            timeout=180,
            what="every run's last step running",
        )
        server.stop()
        time.sleep(OUTAGE_SECONDS)  # the outage itself (no assertion on time)
        server.start()

        def done() -> bool:
            return _rows(
                url,
                "SELECT count(*) FROM workflow_runs WHERE status IN ('queued', 'running')",
            ) == [(0,)]

        wait_until(done, timeout=600, what="the runs to end")
    finally:
        host.stop()
        stop_process_group(main)
    runs = _rows(
        url, "SELECT status, commit_head, commit_error, error FROM workflow_runs"
    )
    assert len(runs) == RUNS
    assert {r[0] for r in runs} == {"succeeded"}, runs
    assert all(r[1] and not r[2] for r in runs), runs
    for log in (host.log_text(), main_log.read_text(errors="replace")):
        assert "Traceback" not in log, log[-6000:]
        assert "reincarnated" not in log, log[-6000:]
