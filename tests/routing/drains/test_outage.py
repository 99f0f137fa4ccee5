"""A database outage during a drain (issue 17 #5), on a private PostgreSQL server that the
test really stops: the drain stops at the first lost connection with its report so far,
stores its record when the database is back (or says it could not: the record it kept as it
went stays, unfinished), and leaves the
candidates it had not reached as they were."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from routing.drains.record_keeper import UNFINISHED
from tests.pgserver import PrivateServer, private_server
from tests.processes import MANAGE_PY, manage, scratch_cwd
from tests.routing.helpers import generic_event

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
EVENTS = 600


@pytest.fixture
def server() -> Iterator[PrivateServer]:
    with private_server() as pg:
        yield pg


def _env(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": url,
        "LOOPSWEB_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "loopsweb.settings",
        **extra,
    }


def _prepared(server: PrivateServer, tmp_path: Path, name: str) -> str:
    url = server.create_database(name)
    manage(_env(url, tmp_path), "migrate", "--noinput", "-v0", timeout=300)
    events = tmp_path / f"{name}.jsonl"
    events.write_text(
        "".join(
            json.dumps(generic_event(project=f"/srv/p{i % 40}")) + "\n"
            for i in range(EVENTS)
        )
    )
    manage(_env(url, tmp_path), "ingest_events", str(events), timeout=300)
    return url


def _states(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT state, count(*) FROM routing_inbox_events GROUP BY state"
        ).fetchall()
    return dict(rows)


def _drain_until_some_admitted(
    url: str, tmp_path: Path, server: PrivateServer, **env: str
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            MANAGE_PY,
            "drain",
            "generic",
            "--max-dispatch",
            str(EVENTS),
            "--json",
        ],
        cwd=scratch_cwd(),
        env=_env(url, tmp_path, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while _states(url).get("admitted", 0) < 10:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the drain admitted nothing"
        time.sleep(0.05)
    server.stop()
    return proc


def test_a_short_outage_stops_the_drain_which_records_itself_when_the_database_is_back(
    server: PrivateServer, tmp_path: Path
) -> None:
    url = _prepared(server, tmp_path, "outage_short")
    # Small batches: the batched admission path, slow enough to be caught part-way.
    proc = _drain_until_some_admitted(
        url,
        tmp_path,
        server,
        LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS="60",
        LOOPSWEB_DRAIN_BATCH_SIZE="5",
    )
    time.sleep(3)
    server.start()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "drain failed: database connection lost" in err
    report = json.loads(out)
    assert report["error"].startswith("database connection lost")
    assert 10 <= report["created"] < EVENTS and report["fatal"] == 0
    states = _states(url)
    # Nothing failed: what was admitted is admitted, everything else is pending as before.
    # A batch whose COMMIT was in flight when the server died may have committed without
    # the drain hearing so: its (at most 5) rows are admitted in the ledger but not counted
    # in the report. Nothing is lost or admitted twice either way.
    assert states.get("failed", 0) == 0
    assert report["created"] <= states["admitted"] <= report["created"] + 5
    assert states["admitted"] + states["pending"] == EVENTS
    with psycopg.connect(url) as conn:
        record = conn.execute("SELECT created, error FROM routing_drains").fetchall()
    assert record == [(report["created"], report["error"])]


def test_a_database_gone_for_good_ends_the_drain_with_its_report_and_says_no_record(
    server: PrivateServer, tmp_path: Path
) -> None:
    url = _prepared(server, tmp_path, "outage_for_good")
    # One candidate at a time: the other admission path.
    proc = _drain_until_some_admitted(
        url,
        tmp_path,
        server,
        LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS="2",
        LOOPSWEB_DRAIN_BATCH_SIZE="1",
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in err
    assert "drain record not stored" in err
    report = json.loads(out)
    assert report["error"].startswith("database connection lost")
    assert report["recordError"].startswith("drain record not stored")
    server.start()
    states = _states(url)
    assert states.get("failed", 0) == 0
    assert states["admitted"] + states["pending"] == EVENTS
    # Its final record was not stored; the one it kept as it went (drains.record_keeper)
    # is there, unfinished, with what it had admitted by its last update.
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT finished_at IS NULL, error, created FROM routing_drains"
        ).fetchall()
    assert [row[:2] for row in rows] == [(True, UNFINISHED)]
    assert 1 <= rows[0][2] <= report["created"]


def test_the_api_answers_a_json_503_while_the_database_is_down(
    server: PrivateServer, tmp_path: Path
) -> None:
    """Issue 17 #4 through the real web server: during an outage the API answers JSON."""
    import urllib.error
    import urllib.request

    from tests.processes import free_port, wait_for_http

    url = server.create_database("outage_api")
    env = _env(url, tmp_path)
    manage(env, "migrate", "--noinput", "-v0", timeout=300)
    created = manage(env, "api_token", "create", "dash", "--scope", "read")
    token = next(w for w in created.stdout.split() if w.startswith("lw_"))
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, MANAGE_PY, "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=scratch_cwd(),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def get() -> tuple[int, str, bytes]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/accounts",
            headers={"Authorization": f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.headers["Content-Type"], answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read()

    try:
        wait_for_http(f"http://127.0.0.1:{port}/admin/login/")
        assert get()[0] == 200
        server.stop()
        status, content_type, body = get()
        assert status == 503 and content_type == "application/json"
        assert json.loads(body)["error"].startswith("database unavailable")
        server.start()
        assert get()[0] == 200
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=60)
