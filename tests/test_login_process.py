"""Admin login brute-force protection through the real web server (issue 17 #9): after
LOOPSWEB_LOGIN_FAILURE_LIMIT wrong passwords, `manage.py runserver` refuses even the right
one, and the attempts are rows in the database."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.processes import (
    MANAGE_PY,
    free_port,
    manage,
    own_sqlite_env,
    scratch_cwd,
    wait_for_http,
)

# A real web server: with the other installations, one at a time, on one xdist worker.
pytestmark = [
    pytest.mark.sqlite,
    pytest.mark.slow,
    pytest.mark.xdist_group("installation"),
]


def _attempt(base: str, password: str) -> tuple[int, str]:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/admin/login/").read().decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found is not None, page
    token = found.group(1)
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": token, "username": "operator", "password": password}
    ).encode()
    request = urllib.request.Request(
        f"{base}/admin/login/", data=form, headers={"Referer": base}
    )
    try:
        answer = opener.open(request)
        return answer.status, answer.geturl()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.geturl()


def test_the_real_server_locks_a_login_out_after_the_failure_limit(
    tmp_path: Path, migrated_sqlite: Callable[[Path], Path]
) -> None:
    env = own_sqlite_env(
        tmp_path,
        LOOPSWEB_ADMIN_USER="operator",
        LOOPSWEB_ADMIN_PASSWORD="a-long-test-password",
        LOOPSWEB_LOGIN_FAILURE_LIMIT="3",
    )
    migrated_sqlite(tmp_path / "loopsweb.sqlite3")
    manage(env, "ensure_staff_user", timeout=300)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, MANAGE_PY, "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=scratch_cwd(),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/admin/login/")
        answers = [_attempt(base, "wrong")[0] for _ in range(3)]
        assert answers == [200, 200, 429]
        status, _ = _attempt(base, "a-long-test-password")
        assert status == 429
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    with sqlite3.connect(tmp_path / "loopsweb.sqlite3") as db:
        (failures,) = db.execute(
            "SELECT failures_since_start FROM axes_accessattempt WHERE username = 'operator'"
        ).fetchone()
    assert failures >= 3
