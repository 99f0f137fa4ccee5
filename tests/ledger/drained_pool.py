"""One task through the real processes with the fake agent as codex (shared by the process
tests of a run that comes back: tests/ledger/test_try_later_process.py,
tests/ledger/test_per_minute_limit_process.py): two registered codex accounts, the task
ingested and drained over them (`manage.py ingest_events` and `drain` in a second terminal),
run by the run cluster with the main cluster beside it (its schedules hand a later run over),
until the item ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings

from ledger.models import WorkflowWorkItem
from tests.ledger.runner_helpers import child_database_url
from tests.processes import (
    manage,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)
from tests.routing.helpers import todos_event

POOL = ("cx-a", "cx-b")


def _ended(clusters: list[tuple[Any, Path]]) -> WorkflowWorkItem | None:
    for cluster, log in clusters:
        assert cluster.poll() is None, log.read_text()[-3000:]
    return WorkflowWorkItem.objects.filter(
        status__in=("succeeded", "failed", "dead_letter", "cancelled")
    ).first()


def drain_one_task(
    tmp_path: Path,
    project: Path,
    agent: dict[str, Any],
    *drain_options: str,
    what: str,
) -> tuple[WorkflowWorkItem, list[dict[str, Any]]]:
    """Drain one task whose fake agent is configured by `agent` (FAKE_AGENT_CONFIG) and
    wait for its item to end; the item and the agent's records (one per invocation, in
    order)."""
    config = tmp_path / "agent.json"
    config.write_text(json.dumps(agent))
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
    event.write_text(json.dumps(todos_event("DRAINED-1", project=str(project))))
    manage(env, "ingest_events", str(event))
    drained = manage(
        env,
        "drain",
        "todos-task",
        "--provider",
        "codex",
        "--auth-profile-pool",
        ",".join(POOL),
        "--json",
        *drain_options,
    )
    assert '"created": 1' in drained.stdout, drained.stdout
    log = tmp_path / "runs.log"
    cluster = start_qcluster(env, log, cluster="loopsweb-runs")
    main_log = tmp_path / "main.log"
    main = start_qcluster(env, main_log)
    try:
        done = wait_until(lambda: _ended([(cluster, log), (main, main_log)]), what=what)
    finally:
        stop_process_group(main)
        stop_process_group(cluster)
    tried = [json.loads(p.read_text()) for p in sorted(records.iterdir())]
    return done, tried
