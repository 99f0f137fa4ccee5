"""One installation, one key: `make run` and every command typed in a second terminal (nothing
exported) share the installation's settings and its generated development SECRET_KEY, so what
one process queues another executes."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import (
    ROOT,
    free_port,
    generic_event,
    http,
    manage,
    scratch_cwd,
    start_make_run,
    stop_make_run,
    terminal_env,
    wait_for_http,
    wait_until,
)

KEY_CODE = (
    "import django; django.setup(); from django.conf import settings; "
    "print(settings.SECRET_KEY); print(settings.DEBUG)"
)


def _settings_of(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", KEY_CODE],
        cwd=scratch_cwd(),
        # PYTHONPATH: `python -c` imports the project from another cwd
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "loopsweb.settings",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.own_database  # terminal_env: the installation's own SQLite file
def test_processes_of_one_installation_share_one_generated_private_key(
    tmp_path: Path,
) -> None:
    env = terminal_env(tmp_path, DEBUG="1")
    first, second = _settings_of(env), _settings_of(env)
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "secret_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert first.stdout == second.stdout
    assert first.stdout.split()[0] == key_file.read_text().strip()
    # Another installation, another key.
    other = _settings_of(terminal_env(tmp_path / "other", DEBUG="1"))
    assert other.stdout.split()[0] != first.stdout.split()[0]


@pytest.mark.slow
@pytest.mark.own_database  # terminal_env: the installation's own SQLite file
def test_the_installation_file_configures_every_process_and_production_needs_a_key(
    tmp_path: Path,
) -> None:
    (tmp_path / "loopsweb.env").write_text("# make run\nDEBUG=1\nLOOPSWEB_HTTPS=0\n")
    dev = _settings_of(terminal_env(tmp_path))
    assert dev.returncode == 0, dev.stderr
    assert dev.stdout.split()[1] == "True"
    # The environment wins over the file: production refuses to start without a key,
    # whatever key file the data directory holds.
    prod = _settings_of(terminal_env(tmp_path, DEBUG="0"))
    assert prod.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in prod.stderr
    with_key = _settings_of(terminal_env(tmp_path, DEBUG="0", SECRET_KEY="k" * 50))
    assert with_key.returncode == 0 and with_key.stdout.split()[0] == "k" * 50
    (tmp_path / "loopsweb.env").write_text("DEBUG 1\n")
    bad = _settings_of(terminal_env(tmp_path))
    assert bad.returncode != 0 and "loopsweb.env:1: expected NAME=value" in bad.stderr


@pytest.mark.sqlite
@pytest.mark.slow
@pytest.mark.xdist_group("installation")  # a whole installation: one at a time
def test_what_the_web_server_and_a_second_terminal_queue_the_run_cluster_executes(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    project = tmp_path / "project"
    project.mkdir()
    port = free_port()
    log = tmp_path / "make-run.log"
    proc = start_make_run(
        terminal_env(
            data, LOOPSWEB_PORT=str(port), LOOPSWEB_ADMIN_PASSWORD="a-long-password-1"
        ),
        log,
    )
    # The second terminal: nothing exported but where the installation lives.
    terminal = terminal_env(data)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/admin/login/", timeout=90)
        token = manage(
            terminal, "api_token", "create", "t", "--scope", "ingest", "--scope", "read"
        ).stdout.strip()

        # Queued by the web server.
        status, answer = http(
            f"{base}/api/v1/events?route=now&max_active=4",
            token=token,
            body=generic_event(project, 1),
        )
        assert status == 202, answer
        (result,) = answer["results"]
        assert result["kind"] == "created"
        # Queued by a command in the second terminal.
        event_file = tmp_path / "event.json"
        event_file.write_text(json.dumps(generic_event(project, 2)))
        routed = json.loads(
            manage(
                terminal,
                "route_event",
                "generic",
                "--event-file",
                str(event_file),
                "--max-active",
                "4",
                "--json",
            ).stdout
        )
        assert routed["kind"] == "created"
        items = [
            result["workItemId"],
            routed.get("workItemId") or routed["workItem"]["id"],
        ]

        def both_done() -> bool:
            states = [
                http(f"{base}/api/v1/work-items/{i}", token=token)[1]["status"]
                for i in items
            ]
            return all(s in {"succeeded", "failed"} for s in states) and states

        states = wait_until(both_done, timeout=120, what="both runs to finish")
        assert states == ["succeeded", "succeeded"]
        # Other README commands work in the second terminal too.
        assert "tick" not in manage(terminal, "schedule_drain", "--list").stdout
        manage(terminal, "drain", "generic", "--max-active", "4", "--dry-run")
        manage(terminal, "api_token", "list", "--json")
    finally:
        stop_make_run(proc)
    output = log.read_text(errors="replace")
    assert "BadSignature" not in output and "Failed to push" not in output
    assert "run-workflow" in output  # executed by the run cluster of make run
    assert stat.S_IMODE((data / "secret_key").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "loopsweb.env").stat().st_mode) == 0o600
