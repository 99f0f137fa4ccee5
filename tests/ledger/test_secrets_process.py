"""No key in the ledger, through the real processes (issue 38, item 5): an account whose
login is an env file, a task routed with `manage.py route_event` and run by the run cluster
(`Q_CLUSTER_NAME=loopsweb-runs manage.py qcluster`), the fake agent echoing the key it was
given on stdout and stderr (`invalid x-api-key sk-...`, as CLIs do), still running while its
output is flushed, then failing. The key's bytes are nowhere in the database: not in the
SQLite file nor its WAL (so not even in a row that was overwritten), not in any row of any
table, not on the item's /ops/ page or in the read API's answer. An env file with a bad line
holding a key fails its step with an error, and `account check` says so, without the key.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from ledger.models import RunStatus, WorkflowRun, WorkflowStepRun
from tests.agents.clis import write_env_file
from tests.ledger.runner_helpers import child_database_url
from tests.processes import (
    generic_event,
    manage,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)
from tests.waiting import hang_deadline

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MARKER = "[redacted:ANTHROPIC_API_KEY]"
ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT)


def _key() -> str:
    return "sk-ant-api03-" + secrets.token_urlsafe(40)


def _database_bytes() -> bytes:
    """The SQLite test database's files as they are on disk (main file, WAL, shm)."""
    name = str(connection.settings_dict["NAME"])
    return b"".join(
        Path(name + suffix).read_bytes()
        for suffix in ("", "-wal", "-shm", "-journal")
        if Path(name + suffix).exists()
    )


def _every_row_as_text() -> str:
    """Every row of every table, as the database renders it (both backends)."""
    out = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            quoted = connection.ops.quote_name(table)
            cursor.execute(f"SELECT * FROM {quoted}")
            out.append(json.dumps(cursor.fetchall(), default=str))
    return "\n".join(out)


def _route(env: dict[str, str], project: Path, n: int, profile: str) -> None:
    done = manage(
        env,
        "route_event",
        "generic",
        "--event-json",
        json.dumps(generic_event(project, n)),
        "--provider",
        "codewith",
        "--auth-profile",
        profile,
        "--max-active",
        "5",
        "--json",
    )
    assert json.loads(done.stdout)["kind"] == "created", done.stdout


def _steps(profile: str) -> list[WorkflowStepRun]:
    return list(WorkflowStepRun.objects.filter(account_profile=profile))


def test_a_key_the_agent_echoes_or_an_env_file_quotes_is_never_stored(
    tmp_path: Path,
) -> None:
    key, pasted = _key(), _key()
    good = write_env_file(tmp_path / "k1.env", {"ANTHROPIC_API_KEY": key})
    bad = write_env_file(tmp_path / "k2.env", {"ANTHROPIC_API_KEY": "placeholder"})
    project = tmp_path / "project"
    project.mkdir()
    records = tmp_path / "records"
    records.mkdir()
    # The agent, its key printed, waits at a barrier that this test releases once it has
    # seen the live output flushed (no sleep decides whether a flush falls inside the step).
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = terminal_env(
        Path(settings.DATA_DIR),
        SECRET_KEY=settings.SECRET_KEY,
        DATABASE_URL=child_database_url(),
        LOOPSWEB_RUN_WORKERS="2",
        LOOPSWEB_OUTPUT_FLUSH_SECONDS="1",
        LOOPSWEB_STEP_START_POLL_SECONDS="1",
        FAKE_AGENT_ECHO_ENV="ANTHROPIC_API_KEY",
        FAKE_AGENT_BARRIER=str(barrier),
        FAKE_AGENT_BARRIER_COUNT="2",
        FAKE_AGENT_BARRIER_SECONDS=str(hang_deadline(180)),
        FAKE_AGENT_EXIT="1",
        FAKE_AGENT_RECORD_DIR=str(records),
    )
    manage(
        env, "account", "add", "k1", "--provider", "codewith", "--env-file", str(good)
    )
    manage(
        env, "account", "add", "k2", "--provider", "codewith", "--env-file", str(bad)
    )
    # After `add` checked it: the key pasted where a name goes (the text before '=').
    bad.write_text(f"# k2's key\n{pasted}=ANTHROPIC_API_KEY\n")
    cluster = start_qcluster(env, tmp_path / "runs.log", cluster="loopsweb-runs")
    try:
        _route(env, project, 1, "k1")
        _route(env, project, 2, "k2")

        def flushed_while_running() -> bool:
            assert cluster.poll() is None, (tmp_path / "runs.log").read_text()[-3000:]
            return any(
                s.status == "running" and MARKER in (s.stdout or "")
                for s in _steps("k1")
            )

        wait_until(
            flushed_while_running, timeout=180, what="k1's live output, redacted"
        )
        (barrier / "released-by-the-test").touch()

        def ended() -> bool:
            assert cluster.poll() is None, (tmp_path / "runs.log").read_text()[-3000:]
            return WorkflowRun.objects.filter(status__in=ENDED).count() == 2

        wait_until(ended, timeout=180, what="both runs to end")
    finally:
        stop_process_group(cluster)

    # k1: the agent had its key, printed it, and failed; the ledger has the marker.
    received = [json.loads(p.read_text()) for p in records.glob("*.json")]
    assert received and all("ANTHROPIC_API_KEY" in r["env_names"] for r in received)
    worker = next(s for s in _steps("k1") if s.step_id == "worker")
    assert worker.status == "failed", (worker.error, worker.stdout, worker.stderr)
    assert f"invalid x-api-key {MARKER}" in (worker.stdout or "")
    assert f"invalid x-api-key {MARKER}" in (worker.stderr or "")
    assert MARKER in (worker.error or ""), worker.error
    assert MARKER in (worker.workflow_run.error or "")
    # k2: its step fails naming the file and line, not the line's text.
    failed = next(s for s in _steps("k2") if s.step_id == "worker")
    assert failed.error == (
        f"account k2: env file {bad}, line 2: the text before '=' is not a variable name"
    )

    everything = _every_row_as_text()
    assert MARKER in everything
    on_disk = _database_bytes() if connection.vendor == "sqlite" else b""
    for secret in (key, pasted):
        assert secret not in everything, "a key is in a row"
        # Also the bytes of rows overwritten since (the live flushes), still in the files.
        assert secret.encode() not in on_disk, "a key is in the database's files"

    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    answers: dict[str, Any] = {}
    for step in (worker, failed):
        item_id = step.workflow_run.work_item_id
        page = client.get(f"/ops/items/{item_id}/")
        api = client.get(f"/api/v1/work-items/{item_id}")
        assert page.status_code == 200 and api.status_code == 200
        answers[f"page {item_id}"] = page.content.decode()
        answers[f"api {item_id}"] = api.content.decode()
    assert any("not a variable name" in text for text in answers.values())
    for where, text in answers.items():
        assert key not in text and pasted not in text, where

    # `account check`: the bad line without its text; the CLI's echo of k1's key redacted.
    checked = {
        name: manage(env, "account", "check", name, check=False)
        for name in ("k1", "k2")
    }
    assert "not a variable name" in checked["k2"].stdout + checked["k2"].stderr
    assert MARKER in checked["k1"].stdout + checked["k1"].stderr, checked["k1"]
    for done in checked.values():
        assert key not in done.stdout + done.stderr
        assert pasted not in done.stdout + done.stderr
