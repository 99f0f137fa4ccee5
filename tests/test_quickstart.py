"""The README quickstart, as a newcomer runs it: `make run` (scripts/run.sh) with the fake
agent in one terminal; `ingest_events examples/todos-task.json` and a drain over two accounts
in another; the qcluster runs the workflow to the end, and `/ops/accounts/` shows the two
accounts with the steps they ran (issue 19)."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import CHILD_TEST_ENV
from tests.test_make_run import _free_port, _wait_for

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.sqlite, pytest.mark.slow]


def _login(base: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/admin/login/").read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    form = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": token,
            "username": "operator",
            "password": "a-long-test-password",
            "next": "/ops/",
        }
    ).encode()
    opener.open(
        urllib.request.Request(
            f"{base}/admin/login/?next=/ops/", data=form, headers={"Referer": base}
        )
    )
    return opener


def test_the_readme_quickstart_ends_with_a_finished_run_on_the_accounts_page(
    tmp_path: Path,
) -> None:
    port = _free_port()
    data = tmp_path / "var"  # the second terminal runs in tmp_path: var/projects/demo
    env = {
        k: v
        for k, v in os.environ.items()
        # as a newcomer's shell: no test key, so make run and the second terminal share
        # the development key of the data directory
        if k
        not in {
            "DATABASE_URL",
            "SQLITE_TEST_NAME",
            *CHILD_TEST_ENV,
            "LOOPSWEB_PROJECT_ROOTS",
            "LOOPSWEB_WORKTREE_DIR",
            "LOOPSWEB_AGENT_ENV_PASSTHROUGH",
        }
    }
    env.update(
        LOOPSWEB_DATA_DIR=str(data),
        LOOPSWEB_PORT=str(port),
        LOOPSWEB_ADMIN_USER="operator",
        LOOPSWEB_ADMIN_PASSWORD="a-long-test-password",
        LOOPSWEB_CODEWITH_BIN=str(ROOT / "scripts" / "fake-agent"),
        FAKE_AGENT_SLEEP="1",
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*",
        PY=sys.executable,
    )
    server = subprocess.Popen(
        ["bash", "scripts/run.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(f"{base}/admin/login/", time.monotonic() + 60)

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
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline:
            status = database.execute(
                "SELECT status FROM workflow_work_items WHERE subject_ref = 'DEMO-1'"
            ).fetchone()[0]
            if status in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
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
            os.killpg(server.pid, signal.SIGINT)
            output = server.communicate(timeout=60)[0]
            raise AssertionError((status, steps, runs, queue, tasks, output[-3000:]))
        assert sorted(s[1] for s in steps) == ["acct-a", "acct-b"]
        assert {(s[2], s[3]) for s in steps} == {("succeeded", 0)}

        accounts = _login(base).open(f"{base}/ops/accounts/").read().decode()
        table = accounts.split('id="table"')[1].split("</section>")[0]
        assert "<code>acct-a</code>" in table and "<code>acct-b</code>" in table
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.communicate(timeout=60)
