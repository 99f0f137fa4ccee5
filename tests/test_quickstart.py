"""The README quickstart, as a newcomer runs it: `make run` (scripts/run.sh) with the fake
agent in one terminal; `ingest_events examples/todos-task.json` and a drain over two accounts
in another; the qcluster runs the workflow to the end, and `/ops/accounts/` shows the two
accounts with the steps they ran (issue 19); then the README's HTTP variant, a token and the
example POSTed with `route=now`, runs to the end too (issue 42)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.processes import (
    ROOT,
    free_port,
    make_run_env,
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


def test_the_readme_quickstart_ends_with_a_finished_run_on_the_accounts_page(
    tmp_path: Path,
) -> None:
    port = free_port()
    data = tmp_path / "var"  # the second terminal runs in tmp_path: var/projects/demo
    # nothing of the suite's: make run and the second terminal share the development key
    # of the data directory
    env = make_run_env(
        data,
        port,
        FAKE_AGENT_SLEEP="1",
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*",
    )
    log = tmp_path / "make-run.log"
    server = start_make_run(env, log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/admin/login/")

        # The second terminal, in a working directory of its own (the project path in the
        # example is relative to it).
        # nothing exported: the commands read make run's var/loopsweb.env, as the README says
        manage = [sys.executable, str(ROOT / "manage.py")]
        # sed "s|@PWD@|$PWD|" examples/todos-task.json | manage.py ingest_events -
        example = (ROOT / "examples" / "todos-task.json").read_text()
        for args, stdin in (
            (["ingest_events", "-"], example.replace("@PWD@", str(tmp_path))),
            (
                [
                    "drain",
                    "todos-task",
                    "--auth-profile-pool",
                    "acct-a,acct-b",
                    "--max-active",
                    "2",
                ],
                None,
            ),
        ):
            done = subprocess.run(
                manage + args,
                cwd=tmp_path,
                env=env,
                input=stdin,
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        assert "created=1" in done.stdout or '"created": 1' in done.stdout, done.stdout

        database = sqlite3.connect(data / "loopsweb.sqlite3", timeout=20)

        def finished() -> str | None:
            (status,) = database.execute(
                "SELECT status FROM workflow_work_items WHERE subject_ref = 'DEMO-1'"
            ).fetchone()
            return status if status in ("succeeded", "failed", "cancelled") else None

        try:
            status = wait_for(finished, timeout=180, interval=0.5, what="DEMO-1")
        except AssertionError as timed_out:
            status = str(timed_out)  # not finished: the state of things is raised below
        steps = database.execute(
            "SELECT step_id, account_profile, status, exit_code FROM workflow_step_runs "
            "ORDER BY sequence"
        ).fetchall()
        runs = database.execute("SELECT status, error FROM workflow_runs").fetchall()
        queue = database.execute("SELECT COUNT(*) FROM django_q_ormq").fetchone()
        tasks = database.execute(
            "SELECT name, success, substr(result, 1, 300) FROM django_q_task"
        ).fetchall()
        database.close()
        if status != "succeeded":
            stop_make_run(server)
            output = log.read_text()
            raise AssertionError((status, steps, runs, queue, tasks, output[-3000:]))
        assert sorted(s[1] for s in steps) == ["acct-a", "acct-b"]
        assert {(s[2], s[3]) for s in steps} == {("succeeded", 0)}

        opener, _ = staff_login(base, "/ops/")
        accounts = opener.open(f"{base}/ops/accounts/").read().decode()
        table = accounts.split('id="table"')[1].split("</section>")[0]
        assert "<code>acct-a</code>" in table and "<code>acct-b</code>" in table

        # "The same over HTTP, routed in the request": a token, then the example with a new
        # id POSTed with route=now and the pool; it routes as a todos task and runs.
        token = subprocess.run(
            manage + ["api_token", "create", "demo", "--scope", "ingest"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        body = (
            example.replace("@PWD@", str(tmp_path))
            .replace("evt-demo-1", "evt-demo-2")
            .replace("DEMO-1", "DEMO-2")
        )
        request = urllib.request.Request(
            f"{base}/api/v1/events?route=now&auth_profile_pool=acct-a,acct-b",
            data=body.encode(),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            routed = json.loads(answer.read())
        assert routed["accepted"] and routed["kindFrom"] == "event type", routed
        assert [r["kind"] for r in routed["results"]] == ["created"], routed
        database = sqlite3.connect(data / "loopsweb.sqlite3", timeout=20)
        try:
            second = wait_for(
                lambda: database.execute(
                    "SELECT status FROM workflow_work_items WHERE subject_ref = 'DEMO-2'"
                    " AND status IN ('succeeded', 'failed', 'cancelled')"
                ).fetchone(),
                timeout=180,
                interval=0.5,
                what="DEMO-2",
            )
        finally:
            database.close()
        assert second == ("succeeded",)
    finally:
        stop_make_run(server)
