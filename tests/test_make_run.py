"""`make run` (scripts/run.sh) for real: migrate, staff user, web server + qcluster, clean stop."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import urllib.request
from pathlib import Path

import pytest

from tests.ledger.runner_helpers import git_project
from tests.processes import (
    free_port,
    make_run_env,
    manage,
    staff_login,
    start_make_run,
    stop_make_run,
    wait_for_http,
)
from tests.waiting import wait_for

# A whole installation (web server, both clusters): one at a time, on one xdist worker.
pytestmark = [
    pytest.mark.sqlite,
    pytest.mark.slow,
    pytest.mark.xdist_group("installation"),
]


def _processes_with_env(marker: str) -> list[int]:
    """Live processes whose environment holds `marker` (the qcluster runs in its own session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker.encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _route_demo_event(base: str, env: dict[str, str], project: Path) -> dict:
    """The newcomer path: an ingest token, then one event for the demo project, routed now."""
    token = manage(
        env, "api_token", "create", "demo", "--scope", "ingest", timeout=60
    ).stdout.strip()
    event = {
        "id": "first-event",
        "type": "demo.requested",
        "source": "readme",
        "data": {"project_path": str(project), "message": "Say hello."},
    }
    request = urllib.request.Request(
        f"{base}/api/v1/events?route=now",
        data=json.dumps(event).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 202
        return json.loads(answer.read())


def _run_row(database: Path, item_id: str) -> tuple | None:
    with sqlite3.connect(database, timeout=20) as db:
        return db.execute(
            "SELECT status, id, worktree_path, worktree_branch, worktree_removed_at, error"
            " FROM workflow_runs WHERE work_item_id = ?",
            [item_id],
        ).fetchone()


def test_make_run_serves_the_login_page_the_staff_user_signs_in_and_ctrl_c_stops_everything(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = make_run_env(tmp_path, port)
    log = tmp_path / "make-run.log"
    proc = start_make_run(env, log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/admin/login/")

        _, landed = staff_login(base, "/admin/")
        assert landed.geturl().endswith("/admin/")
        assert "Site administration" in landed.read().decode()

        # make run's demo root: an event for the demo project is admitted and the qcluster
        # runs it (the fake agent standing in for codewith) in its own git worktree.
        demo = tmp_path / "projects" / "demo"
        assert (demo / ".git").exists()
        api_env = {**env, "DEBUG": "1", "LOOPSWEB_HTTPS": "0"}
        answer = _route_demo_event(base, api_env, demo)
        assert answer["results"][0]["kind"] == "created", answer
        item_id = answer["results"][0]["workItemId"]
        database = tmp_path / "loopsweb.sqlite3"

        def ended() -> bool:
            row = _run_row(database, item_id)
            # The runner records the worktree's removal just after the run's end.
            if not row or row[0] in ("queued", "running"):
                return False
            return row[0] != "succeeded" or row[4] is not None

        # Not ended by the deadline: the row's status and error say where it stands.
        with contextlib.suppress(AssertionError):
            wait_for(ended, timeout=180, interval=0.3, what="the demo run to end")
        status, run_id, worktree, branch, removed_at, error = _run_row(
            database, item_id
        )
        assert status == "succeeded", error
        assert worktree == str(tmp_path / "worktrees" / run_id)
        assert branch == f"loopsweb/run-{run_id}" and removed_at is not None
        assert not Path(worktree).exists()
    finally:
        stop_make_run(proc)
    assert proc.returncode != -signal.SIGKILL, "make run did not stop on Ctrl-C"
    output = log.read_text()
    marker = f"LOOPSWEB_DATA_DIR={tmp_path}"
    wait_for(
        lambda: not _processes_with_env(marker),
        timeout=120,
        interval=0.2,
        what="no process of make run left after Ctrl-C",
    )
    assert "created staff user 'operator'" in output
    assert f"demo project root {tmp_path / 'projects'}" in output
    assert (tmp_path / "loopsweb.sqlite3").exists()


def test_make_run_takes_the_project_roots_its_env_file_names(tmp_path: Path) -> None:
    """Issue 62 item 1: with nothing exported, the roots `var/loopsweb.env` names are the
    ones every process of make run works with (the web server admits a project there, the
    run cluster runs it), and no demo root is made beside them."""
    mine = tmp_path / "mine"
    project = git_project(mine / "app")
    env_file = tmp_path / "loopsweb.env"
    env_file.write_text(f"DEBUG=1\nLOOPSWEB_HTTPS=0\nLOOPSWEB_PROJECT_ROOTS={mine}\n")
    env_file.chmod(0o600)
    port = free_port()
    env = make_run_env(tmp_path, port)
    assert "LOOPSWEB_PROJECT_ROOTS" not in env
    log = tmp_path / "make-run.log"
    proc = start_make_run(env, log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/admin/login/")
        answer = _route_demo_event(base, {**env, "DEBUG": "1"}, project)
        assert answer["results"][0]["kind"] == "created", answer
        item_id = answer["results"][0]["workItemId"]
        database = tmp_path / "loopsweb.sqlite3"

        def ended() -> bool:
            row = _run_row(database, item_id)
            return bool(row) and row[0] not in ("queued", "running")

        with contextlib.suppress(AssertionError):
            wait_for(ended, timeout=180, interval=0.3, what="the run to end")
        status, *_, error = _run_row(database, item_id)
        assert status == "succeeded", error
    finally:
        stop_make_run(proc)
    assert proc.returncode != -signal.SIGKILL, "make run did not stop on Ctrl-C"
    assert "demo project root" not in log.read_text()
    assert not (tmp_path / "projects").exists()
    assert env_file.read_text().endswith(f"LOOPSWEB_PROJECT_ROOTS={mine}\n")
    wait_for(
        lambda: not _processes_with_env(f"LOOPSWEB_DATA_DIR={tmp_path}"),
        timeout=120,
        interval=0.2,
        what="no process of make run left after Ctrl-C",
    )
