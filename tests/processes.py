"""Helpers for tests that start loopsweb's real processes: `make run` (scripts/run.sh), qclusters,
management commands, and read what they did."""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

from agents.providers import PROVIDERS
from tests.conftest import CHILD_TEST_ENV
from tests.waiting import hang_deadline
from tests.waiting import wait_for as wait_until  # the suite's one polling helper

ROOT = Path(__file__).resolve().parent.parent
MANAGE_PY = str(ROOT / "manage.py")
FAKE_AGENT = ROOT / "scripts" / "fake-agent"
# What a fresh terminal does not have: the suite's own configuration.
SUITE_ONLY = {
    "DATABASE_URL",
    "LOOPSWEB_TESTING",
    "SQLITE_TEST_NAME",
    "SECRET_KEY",
    "DEBUG",
    "LOOPSWEB_HTTPS",
    "Q_CLUSTER_NAME",
    "DJANGO_SETTINGS_MODULE",
}


_scratch: Path | None = None


def scratch_cwd() -> Path:
    """The working directory of the processes tests start: a temporary directory of this
    test process, never the checkout (a relative path, an agent's file, or a project that
    defaults to the working directory would land in the checkout). Removed at exit."""
    global _scratch
    if _scratch is None or not _scratch.is_dir():
        _scratch = Path(tempfile.mkdtemp(prefix="loopsweb-test-cwd-"))
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


# The ports of the servers tests start come from below the kernel's ephemeral range, so no
# other process's bind(0) or outgoing connection (the other suite's servers, a database
# client) can take one between a test picking it and its server binding it; once that
# happened and the test talked to another suite's server. A lock file per port, held until
# the test process exits, keeps the test processes of both suites from picking the same one.
_PORTS_LOW = 20000
_PORT_LOCKS: list[int] = []
# Not `random` itself: pytest-randomly seeds it alike in every worker.
_port_choice = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port no other process uses and no other test process will pick."""
    high = _ephemeral_low()
    locks = Path(tempfile.gettempdir()) / "loopsweb-test-ports"
    try:
        locks.mkdir()
        locks.chmod(0o1777)  # shared like /tmp: the suite's unprivileged processes too
    except FileExistsError:
        pass
    for _ in range(1000):
        port = _port_choice.randrange(_PORTS_LOW, max(high, _PORTS_LOW + 1000))
        try:
            fd = os.open(locks / str(port), os.O_CREAT | os.O_RDWR, 0o666)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:
            os.close(fd)
            continue
        _PORT_LOCKS.append(fd)
        return port
    raise RuntimeError(f"no free port between {_PORTS_LOW} and {high}")


def own_sqlite_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The suite's environment with a SQLite file of its own in `data_dir` instead of the
    suite's database (tests marked `own_database`)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SQLITE_TEST_NAME"}
    }
    env.update(
        LOOPSWEB_DATA_DIR=str(data_dir),
        DJANGO_SETTINGS_MODULE="loopsweb.settings",
        **extra,
    )
    return env


def terminal_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """A second terminal's environment: nothing of the suite, the installation's data dir."""
    env = {k: v for k, v in os.environ.items() if k not in SUITE_ONLY}
    env.update(
        LOOPSWEB_DATA_DIR=str(data_dir),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **{f"LOOPSWEB_{p.upper()}_BIN": str(FAKE_AGENT) for p in PROVIDERS},
    )
    env.update(extra)
    return env


STAFF_USER = "operator"
STAFF_PASSWORD = "a-long-test-password"


def make_run_env(data_dir: Path, port: int, **extra: str) -> dict[str, str]:
    """A newcomer's shell for `make run`: none of the suite's settings (no test key, so make
    run and a second terminal share the data directory's development key; no isolation
    settings, so make run chooses its demo root), a staff user, the fake agent as codewith."""
    dropped = {
        "DATABASE_URL",
        "SQLITE_TEST_NAME",
        *CHILD_TEST_ENV,
        "LOOPSWEB_PROJECT_ROOTS",
        "LOOPSWEB_WORKTREE_DIR",
        "LOOPSWEB_AGENT_ENV_PASSTHROUGH",
    }
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        LOOPSWEB_DATA_DIR=str(data_dir),
        LOOPSWEB_PORT=str(port),
        LOOPSWEB_ADMIN_USER=STAFF_USER,
        LOOPSWEB_ADMIN_PASSWORD=STAFF_PASSWORD,
        LOOPSWEB_CODEWITH_BIN=str(FAKE_AGENT),
        PY=sys.executable,
    )
    env.update(extra)
    return env


def staff_login(base: str, next_path: str) -> tuple[urllib.request.OpenerDirector, Any]:
    """Sign the staff user in through the admin login form: (opener with the session
    cookie, the response the login redirected to)."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(CookieJar())
    )
    page = opener.open(f"{base}/admin/login/").read().decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found, "no CSRF token on the login page"
    form = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": found.group(1),
            "username": STAFF_USER,
            "password": STAFF_PASSWORD,
            "next": next_path,
        }
    ).encode()
    landed = opener.open(
        urllib.request.Request(
            f"{base}/admin/login/?next={next_path}",
            data=form,
            headers={"Referer": base},
        )
    )
    return opener, landed


# `argv` with SIGINT back to its default first. A shell cannot trap a signal that was ignored
# when it started, and a suite started in the background (nohup, `cmd &` in a script, some CI
# runners) hands its children SIGINT ignored: run.sh's Ctrl-C handler would never run, and its
# clusters (each in a session of its own) would be left behind when the test gives up.
INTERRUPTIBLE = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])",
)


def start_make_run(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """scripts/run.sh (what `make run` runs), output to `log`, in its own session, with
    Ctrl-C (SIGINT) as a terminal's (INTERRUPTIBLE)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                *INTERRUPTIBLE,
                "bash",
                str(ROOT / "scripts" / "run.sh"),
            ],  # from the checkout
            cwd=scratch_cwd(),
            env={**env, "PY": sys.executable},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_make_run(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as a terminal sends it (to the whole foreground group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    try:
        # run.sh bounds its own stop (30 s for the clusters, then SIGKILL): only a hang
        # reaches this deadline.
        proc.wait(timeout=hang_deadline(180))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_qcluster(
    env: dict[str, str], log: Path, *, cluster: str | None = None
) -> subprocess.Popen[bytes]:
    """`manage.py qcluster` (the run cluster with `cluster`), in its own session."""
    if cluster:
        env = {**env, "Q_CLUSTER_NAME": cluster}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, MANAGE_PY, "qcluster"],
            cwd=scratch_cwd(),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_process_group(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def manage(
    env: dict[str, str],
    *args: str,
    check: bool = True,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`manage.py ARGS` with `env`, in `scratch_cwd()`, `input` on its stdin; its output
    captured as text. `check`: assert that it exited 0, naming the command and its output."""
    done = subprocess.run(
        [sys.executable, MANAGE_PY, *args],
        cwd=scratch_cwd(),
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert done.returncode == 0, (
            f"manage.py {' '.join(args[:2])}: exit {done.returncode}\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def http(
    url: str,
    *,
    token: str | None = None,
    body: Any = None,
    timeout: float = 60,
) -> tuple[int, Any]:
    """One request; JSON in and out. Returns (status, decoded body)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_for_http(url: str, *, timeout: float = 60) -> None:
    def answers() -> bool:
        try:
            urllib.request.urlopen(url, timeout=2)
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    wait_until(answers, timeout=timeout, what=f"{url} to answer")


def generic_event(project: Path, n: int) -> dict[str, Any]:
    return {
        "id": f"evt-capacity-{n}-{time.time_ns()}",
        "type": "build.failed",
        "source": "ci",
        "data": {"project_path": str(project), "title": f"Fix {n}", "message": "red"},
    }


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end before a start at the same instant)."""
    points = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda p: (p[0], p[1]),
    )
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best
