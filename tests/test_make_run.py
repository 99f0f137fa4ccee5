"""`make run` (scripts/run.sh) for real: migrate, staff user, web server + qcluster, clean stop."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import CHILD_TEST_ENV

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.sqlite, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in time")


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


def test_make_run_serves_the_login_page_the_staff_user_signs_in_and_ctrl_c_stops_everything(
    tmp_path: Path,
) -> None:
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SQLITE_TEST_NAME", *CHILD_TEST_ENV}
    }
    env.update(
        LOOPSWEB_DATA_DIR=str(tmp_path),
        LOOPSWEB_PORT=str(port),
        LOOPSWEB_ADMIN_USER="operator",
        LOOPSWEB_ADMIN_PASSWORD="a-long-test-password",
        PY=sys.executable,
    )
    proc = subprocess.Popen(
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

        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = opener.open(f"{base}/admin/login/").read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": token,
                "username": "operator",
                "password": "a-long-test-password",
                "next": "/admin/",
            }
        ).encode()
        request = urllib.request.Request(
            f"{base}/admin/login/?next=/admin/", data=form, headers={"Referer": base}
        )
        landed = opener.open(request)
        assert landed.geturl().endswith("/admin/")
        assert "Site administration" in landed.read().decode()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    marker = f"LOOPSWEB_DATA_DIR={tmp_path}"
    deadline = time.monotonic() + 20
    while _processes_with_env(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_with_env(marker), "a process of make run outlived Ctrl-C"
    assert "created staff user 'operator'" in output
    assert (tmp_path / "loopsweb.sqlite3").exists()
