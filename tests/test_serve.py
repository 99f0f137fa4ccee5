"""Production as operators run it: `scripts/serve.sh` (what `make serve` runs) for real, and the
recipe in deploy/.

The serve test starts `scripts/serve.sh` on a free port with production settings on a fresh
database of the suite's backend (a SQLite file, or a new PostgreSQL database on the suite's
server): DEBUG off, a real SECRET_KEY, ALLOWED_HOSTS, the static manifest. Only HTTPS is off
(LOOPSWEB_HTTPS=0, the documented switch for plain HTTP on loopback): with it on, every request
would be redirected to an https:// port nobody listens on.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CHILD_TEST_ENV
from tests.processes import (
    ROOT,
    SUITE_ONLY,
    free_port,
    manage,
    scratch_cwd,
    wait_until,
)
from tests.settings_scan import settings_read_by_code

DEPLOY = ROOT / "deploy"
SERVE = str(ROOT / "scripts" / "serve.sh")  # it changes into the checkout itself
UNITS = sorted(
    [*DEPLOY.glob("*.service"), *DEPLOY.glob("*.socket"), *DEPLOY.glob("*.timer")],
    key=lambda p: p.name,
)
UNITS_NAMES = {unit.name for unit in UNITS}
STAFF_USER = "operator"
STAFF_PASSWORD = "a-long-serve-test-password"
HASHED = re.compile(r"\.[0-9a-f]{12}\.(css|js)$")

# --- the environment file template names every setting the code reads ---


def template_names() -> list[str]:
    names = []
    for line in (DEPLOY / "loopsweb.env.example").read_text().splitlines():
        found = re.match(r"^#?([A-Z][A-Z0-9_]*)=", line)
        if found:
            names.append(found.group(1))
    return names


@pytest.mark.xdist_group("source_rules")  # parses the product: tests/source_index.py
def test_env_template_names_every_setting_the_code_reads_once() -> None:
    in_template = template_names()
    assert len(in_template) == len(set(in_template)), "a setting listed twice"
    read = settings_read_by_code()
    # the scan found the settings it must (it is not vacuous)
    assert {"SECRET_KEY", "LOOPSWEB_WEB_WORKERS", "LOOPSWEB_CLAUDE_BIN"} <= read
    assert set(in_template) - read == set(), "listed but read by no code"
    assert read - set(in_template) == set(), (
        "read by the code, missing from the template"
    )


@pytest.mark.own_database  # _clean_env: no DATABASE_URL, the data directory's own SQLite
@pytest.mark.slow
def test_env_template_defaults_are_the_code_defaults(tmp_path: Path) -> None:
    # Uncommenting every line as it stands (with the required ones filled) changes nothing:
    # the values are the defaults. Compared in a production process, settings dumped as JSON.
    lines = []
    for line in (DEPLOY / "loopsweb.env.example").read_text().splitlines():
        found = re.match(r"^#?([A-Z][A-Z0-9_]*)=(.*)$", line)
        if found and found.group(2) and found.group(1) != "LOOPSWEB_DATA_DIR":
            lines.append(f"{found.group(1)}={found.group(2)}")
    dump = (
        "import json; from django.conf import settings as s; print(json.dumps({"
        "k: getattr(s, k) for k in dir(s) if k.isupper() and not k.startswith('_')},"
        " sort_keys=True, default=lambda o: sorted(o) if isinstance(o, (set, frozenset))"
        " else str(o)))"
    )
    base = {
        **_clean_env(tmp_path),
        "SECRET_KEY": "x" * 50,
        "ALLOWED_HOSTS": "loops.example.com",
    }

    def settings_with(extra: dict[str, str]) -> dict[str, Any]:
        done = manage({**base, **extra}, "shell", "-c", dump)
        return json.loads(done.stdout.strip().splitlines()[-1])

    defaults = settings_with({})
    explicit = settings_with(dict(line.split("=", 1) for line in lines))
    assert len(lines) > 40
    assert explicit == defaults


# --- systemd units and Procfile ---


@pytest.mark.slow
def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (no systemd on this machine)")
    # The units name the documented install path; verify them where this checkout is, so
    # the commands they start exist and are executable.
    for unit in UNITS:
        text = unit.read_text().replace("/opt/loopsweb", str(ROOT))
        (tmp_path / unit.name).write_text(text)
    done = subprocess.run(
        [analyze, "verify", *(str(tmp_path / u.name) for u in UNITS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == "", done.stderr
    # the check is not vacuous: a unit with an unknown key or a missing command fails it
    broken = tmp_path / "broken.service"
    broken.write_text("[Service]\nExecStart=/nonexistent/serve.sh web\n")
    done = subprocess.run(
        [analyze, "verify", str(broken)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "not executable" in done.stderr


def test_units_and_procfile_start_each_process_alone() -> None:
    starts = {
        unit.name: re.search(r"^ExecStart=(.*)$", unit.read_text(), re.M)
        for unit in UNITS
        if unit.suffix == ".service"
    }
    assert {name: m.group(1) for name, m in starts.items() if m} == {
        "loopsweb-setup.service": "/opt/loopsweb/scripts/serve.sh setup",
        "loopsweb-web.service": "/opt/loopsweb/scripts/serve.sh web",
        "loopsweb-cluster.service": "/opt/loopsweb/scripts/serve.sh cluster",
        "loopsweb-runs.service": "/opt/loopsweb/scripts/serve.sh runs",
        # monitoring, on its timer: the installation's health, not a process
        "loopsweb-health.service": "/opt/loopsweb/scripts/serve.sh health",
    }
    timer = (DEPLOY / "loopsweb-health.timer").read_text()
    assert "OnUnitActiveSec=" in timer and "loopsweb-health.timer" in UNITS_NAMES
    for unit in UNITS:
        if unit.suffix == ".service":
            assert "EnvironmentFile=/etc/loopsweb/loopsweb.env" in unit.read_text()
    procfile = dict(
        line.split(": ", 1) for line in (DEPLOY / "Procfile").read_text().splitlines()
    )
    assert procfile == {
        "release": "scripts/serve.sh setup",
        "web": "scripts/serve.sh web",
        "cluster": "scripts/serve.sh cluster",
        "runs": "scripts/serve.sh runs",
    }


# --- scripts/serve.sh for real ---


def _clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """A production shell: none of the suite's settings, this data directory."""
    dropped = {
        *SUITE_ONLY,
        *CHILD_TEST_ENV,
        "ALLOWED_HOSTS",
        "LOOPSWEB_STATIC_MANIFEST",
        "LOOPSWEB_AGENT_SANDBOX",  # the suite's choice for the fake agent (tests/conftest.py)
    }
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        LOOPSWEB_DATA_DIR=str(data_dir),
        PY=sys.executable,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    env.update(extra)
    return env


def _serve(
    env: dict[str, str], log: Path, *mode: str
) -> subprocess.Popen[bytes]:  # own session: a Ctrl-C goes to its whole group
    with log.open("ab") as out:
        return subprocess.Popen(
            ["bash", SERVE, *mode],
            cwd=scratch_cwd(),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _serve_once(
    env: dict[str, str], *mode: str, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """`scripts/serve.sh MODE` to its end (setup, health, a refused start)."""
    return subprocess.run(
        ["bash", SERVE, *mode],
        cwd=scratch_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _production_env(
    data: Path, port: int, database: str, **extra: str
) -> dict[str, str]:
    """Production settings on a free loopback port, one web worker, plain HTTP (the
    documented switch for loopback, docs/operations.md "Production")."""
    return _clean_env(
        data,
        DATABASE_URL=database,
        SECRET_KEY=secrets.token_urlsafe(50),
        LOOPSWEB_HTTPS="0",
        LOOPSWEB_BIND=f"127.0.0.1:{port}",
        LOOPSWEB_WEB_WORKERS="1",
        **extra,
    )


def _stop(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, *, group: bool = False
) -> int:
    """`group`: to the whole process group, as a terminal's Ctrl-C; otherwise to the main
    process only, as systemd's KillMode=mixed (a qcluster stops its own workers)."""
    if proc.poll() is None:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("serve.sh did not stop within 120 s") from None


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment holds `marker` (the clusters run in their own
    sessions, so only the environment ties them to this test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _health(
    base: str, path: str = "/health/installation"
) -> tuple[int, dict[str, Any]]:
    """The installation's health (clusters), or with `path="/healthz"` the web's own."""
    status, _, body = _get(f"{base}{path}")
    return status, json.loads(body)


@pytest.fixture
def serve_database(tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of the suite's backend for the served installation."""
    from django.db import connection

    if connection.vendor == "sqlite":
        yield f"sqlite:///{tmp_path / 'data' / 'loopsweb.sqlite3'}"
        return
    import psycopg

    s = connection.settings_dict
    name = f"serve_{secrets.token_hex(6)}"
    params = {
        "host": s.get("HOST") or "127.0.0.1",
        "port": s.get("PORT") or 5432,
        "user": s.get("USER"),
        "password": s.get("PASSWORD") or None,
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    from urllib.parse import quote

    auth = quote(s.get("USER") or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    try:
        yield f"postgres://{auth}@{params['host']}:{params['port']}/{name}"
    finally:
        with psycopg.connect(**params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.own_database  # _clean_env: no DATABASE_URL, the data directory's own SQLite
@pytest.mark.slow
def test_web_alone_serves_on_the_socket_systemd_passes(tmp_path: Path) -> None:
    # deploy/loopsweb-web.socket + loopsweb-web.service: systemd listens and hands the socket
    # to `serve.sh web`; gunicorn serves on it, not on LOOPSWEB_BIND.
    activate = shutil.which("systemd-socket-activate")
    if activate is None:
        pytest.skip(
            "systemd-socket-activate is not installed (no systemd on this machine)"
        )
    port, unused = free_port(), free_port()
    env = _clean_env(
        tmp_path / "data",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="127.0.0.1",
        LOOPSWEB_HTTPS="0",
        LOOPSWEB_BIND=f"127.0.0.1:{unused}",
        LOOPSWEB_WEB_WORKERS="1",
    )
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            # the tool passes only what -E names on to the process it starts
            [activate, "-l", f"127.0.0.1:{port}"]
            + [f"-E{name}" for name in env]
            + [SERVE, "web"],
            cwd=scratch_cwd(),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: _answers(f"http://127.0.0.1:{port}"),
            timeout=120,
            what="gunicorn on the passed socket",
        )
        # not migrated: the database answers, so the web is healthy, but it has no tables,
        # so the installation's health read fails, reported as such
        status, body = _health(f"http://127.0.0.1:{port}", "/healthz")
        assert (status, body) == (200, {"status": "ok", "database": "ok"}), body
        status, body = _health(f"http://127.0.0.1:{port}")
        assert status == 503 and body["database"] == "unavailable", body
        assert not _answers(f"http://127.0.0.1:{unused}")
    finally:
        _stop(proc)
    assert "Listening at: http://127.0.0.1:" in log.read_text()


@pytest.mark.slow
def test_web_alone_is_healthy_while_no_cluster_runs_and_the_installation_is_not(
    tmp_path: Path, serve_database: str
) -> None:
    # Issue 42 item 8: a load balancer probing /healthz keeps a web machine whose clusters
    # are down; /health/installation and `manage.py health` say the installation is not
    # working. Then the same web process with its database gone: /healthz 503, /livez 200.
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = _production_env(
        tmp_path / "data", port, serve_database, ALLOWED_HOSTS="127.0.0.1"
    )
    setup = _serve_once(env, "setup", timeout=300)
    assert setup.returncode == 0, setup.stderr
    web = _serve(env, tmp_path / "web.log", "web")
    try:
        wait_until(lambda: _answers(base), timeout=120, what="gunicorn to answer")
        for path in ("/healthz", "/readyz"):
            assert _health(base, path) == (200, {"status": "ok", "database": "ok"})
        assert _health(base, "/livez") == (200, {"status": "ok"})
        status, headers, raw = _get(f"{base}/health/installation")
        body = json.loads(raw)
        assert status == 503 and headers["Retry-After"] == "10", body
        assert body["status"] == "unhealthy" and body["database"] == "ok"
        assert body["problems"] == [
            "cluster loopsweb has never reported",
            "cluster loopsweb-runs has never reported",
        ]
        done = manage(env, "health", "--json", check=False)
        assert done.returncode == 1, done.stderr
        assert json.loads(done.stdout) == body
        # what deploy/loopsweb-health.service runs on its timer
        done = _serve_once(env, "health")
        assert done.returncode == 1, done.stderr
        assert "problem: cluster loopsweb-runs has never reported" in done.stderr
    finally:
        assert _stop(web) == 0, (tmp_path / "web.log").read_text()[-2000:]

    gone = {**env, "DATABASE_URL": f"postgres://lw:pw@127.0.0.1:{free_port()}/none"}
    web = _serve(gone, tmp_path / "web-gone.log", "web")
    try:
        wait_until(lambda: _answers(base), timeout=120, what="gunicorn to answer")
        assert _health(base, "/livez") == (200, {"status": "ok"})
        status, headers, raw = _get(f"{base}/healthz")
        assert status == 503 and headers["Retry-After"] == "10"
        assert json.loads(raw) == {
            "status": "unhealthy",
            "database": "unavailable",
            "problems": ["the database does not answer"],
        }
        assert _health(base)[0] == 503
    finally:
        assert _stop(web) == 0, (tmp_path / "web-gone.log").read_text()[-2000:]


@pytest.mark.own_database  # _clean_env: no DATABASE_URL, the data directory's own SQLite
@pytest.mark.slow
def test_serve_refuses_to_start_without_secret_key_or_allowed_hosts(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    for extra, message in (
        ({}, "loopsweb: SECRET_KEY must be set when DEBUG is off"),
        ({"SECRET_KEY": "k" * 50}, "loopsweb: ALLOWED_HOSTS must be set"),
        (
            {"SECRET_KEY": "k" * 50, "ALLOWED_HOSTS": "h", "LOOPSWEB_WEB_WORKERS": "0"},
            "loopsweb: LOOPSWEB_WEB_WORKERS must be >= 1, got '0'",
        ),
        # DEBUG=1 in the installation's file does not survive: serve forces DEBUG off
        ({"DEBUG": "1"}, "loopsweb: SECRET_KEY must be set when DEBUG is off"),
    ):
        for mode in ((), ("web",), ("runs",), ("health",)):
            done = _serve_once(_clean_env(data, **extra), *mode)
            assert done.returncode == 2, (mode, done.stderr)
            assert message in done.stderr, (mode, done.stderr)
            assert "Traceback" not in done.stderr
    # nothing was migrated or collected
    database = data / "loopsweb.sqlite3"
    assert not database.exists() or database.stat().st_size == 0
    assert not (data / "static").exists()
    bad = _serve_once(_clean_env(data), "everything")
    assert bad.returncode == 2 and "usage: scripts/serve.sh" in bad.stderr


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.xdist_group("installation")  # a whole installation: one at a time
def test_serve_in_production_admin_styled_ops_scripts_health_and_clean_stop(
    tmp_path: Path, serve_database: str
) -> None:
    from tests.routing.ops.browser import CHROMEDRIVER, CHROMIUM

    if os.environ.get("LOOPSWEB_SKIP_BROWSER") == "1":
        pytest.skip("LOOPSWEB_SKIP_BROWSER=1")
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: `apt-get install -y chromium chromium-driver`"
            " (make test does), or set LOOPSWEB_SKIP_BROWSER=1",
            pytrace=False,
        )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    marker = f"LOOPSWEB_SERVE_TEST={secrets.token_hex(8)}"
    env = _production_env(
        tmp_path / "data",
        port,
        serve_database,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        LOOPSWEB_WEB_THREADS="2",
        Q_WORKERS="1",
        LOOPSWEB_RUN_WORKERS="1",
        LOOPSWEB_ADMIN_USER=STAFF_USER,
        LOOPSWEB_ADMIN_PASSWORD=STAFF_PASSWORD,
    )
    env[marker.split("=")[0]] = marker.split("=")[1]
    log = tmp_path / "serve.log"
    proc = _serve(env, log)
    try:
        # migrate, collectstatic, then gunicorn answers; the main cluster reports once its
        # scheduler (every 30 s) fired recover-expired-runs and a worker ran it
        def answering() -> int | None:
            assert proc.poll() is None, log.read_text()
            try:
                return _health(base)[0]
            except OSError:
                return None

        started = time.monotonic()
        wait_until(answering, timeout=180, what="gunicorn to answer")
        print(f"serve: gunicorn answered after {time.monotonic() - started:.0f} s")
        manage(env, "ensure_staff_user")
        # collectstatic wrote the manifest and the compressed copies
        static = tmp_path / "data" / "static"
        assert (static / "staticfiles.json").is_file()
        assert list(static.glob("admin/css/base.*.css.gz"))

        assets = _browse_admin_and_ops(tmp_path, base)
        css = [u for u in assets if u.endswith(".css")]
        scripts = [u for u in assets if u.endswith(".js")]
        assert any("/static/admin/css/base." in u for u in css), css
        assert scripts, "the ops page loads no script"
        for url in css + scripts:
            assert HASHED.search(url), f"not a hashed name: {url}"
            status, headers, content = _get(url)
            assert status == 200, url
            want = "text/css" if url.endswith(".css") else "text/javascript"
            assert headers["Content-Type"].startswith(want), (url, headers)
            assert "immutable" in headers["Cache-Control"], headers
            assert content
        # the unhashed name is not what pages use, and a missing file is a 404
        assert _get(f"{base}/static/admin/css/missing.css")[0] == 404
        # The pages need no cluster: they are browsed while the scheduler's first cycle runs.
        # That cycle is what is waited for (up to 30 s): one request a second, not ten, each
        # being CPU of the server's too.
        status, body = wait_until(
            lambda: (answering() == 200 and _health(base)) or None,
            timeout=180,
            interval=1,
            what="/health/installation 200",
        )
        print(f"serve: installation healthy after {time.monotonic() - started:.0f} s")
        assert body["status"] == "ok"
        assert body["database"] == "ok"
        assert body["clusters"]["loopsweb"]["status"] == "ok"
        assert body["clusters"]["loopsweb-runs"] == {
            **body["clusters"]["loopsweb-runs"],
            "status": "ok",
            "workers": 1,
        }
        assert _health(base, "/healthz") == (200, {"status": "ok", "database": "ok"})
        # gunicorn's access log, in the combined format: a worker writes the line after it
        # sent the response, so the line may land a moment after the answer did.
        access_line = re.compile(
            r'127\.0\.0\.1 - - \[[^\]]+\] "GET /healthz HTTP/1\.1" 200 \d+ "-" "[^"]*"$',
            re.M,
        )
        wait_until(
            lambda: access_line.search(log.read_text()),
            timeout=60,
            what="gunicorn's access-log line for /healthz",
        )
    finally:
        # one Ctrl-C stops gunicorn and both clusters, nothing left behind
        code = _stop(proc, signal.SIGINT, group=True)
    assert code in (0, 130), log.read_text()[-3000:]
    wait_until(lambda: not _processes_with(marker), timeout=60, what="no process left")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{base}/healthz", timeout=5)

    # Each process alone (as systemd runs them): the web server and the main cluster, but no
    # run cluster: once the run cluster's last report is older than its interval, 503.
    web = _serve(env, tmp_path / "web.log", "web")
    cluster = _serve(env, tmp_path / "cluster.log", "cluster")
    runs = None
    try:
        status, body = wait_until(
            lambda: (
                (lambda r: r if r[0] == 503 else None)(_health(base))
                if _answers(base)
                else None
            ),
            timeout=120,
            interval=1,  # the 35 s report limit is what is waited for (see above)
            what="/health/installation 503 without a run cluster",
        )
        # the web machine stays in rotation: its own health does not read the clusters
        assert _health(base, "/healthz") == (200, {"status": "ok", "database": "ok"})
        assert body["status"] == "unhealthy"
        assert body["clusters"]["loopsweb"]["status"] == "ok"
        assert body["clusters"]["loopsweb-runs"]["status"] == "not reporting"
        assert body["clusters"]["loopsweb-runs"]["workers"] == 0
        assert body["problems"] == [
            "cluster loopsweb-runs has not reported within 35 s"
        ]
        done = manage(env, "health", check=False)
        assert (
            done.returncode == 1
            and "cluster loopsweb-runs has not reported" in done.stderr
        )
        _production_answers(base, env, tmp_path / "web.log")
        # the run cluster back: healthy again
        runs = _serve(env, tmp_path / "runs.log", "runs")
        wait_until(
            lambda: _health(base)[0] == 200,
            timeout=120,
            what="/health/installation 200 again",
        )
        assert manage(env, "health").returncode == 0
    finally:
        for proc_alone in (web, cluster, runs):
            if proc_alone is not None:
                # started alone, each is the process systemd signals: SIGTERM stops it
                mode = str(proc_alone.args[-1])
                assert _stop(proc_alone) == 0, (tmp_path / f"{mode}.log").read_text()[
                    -2000:
                ]
    wait_until(lambda: not _processes_with(marker), timeout=60, what="no process left")
    if serve_database.startswith("sqlite"):
        with sqlite3.connect(serve_database.removeprefix("sqlite:///")) as db:
            assert db.execute("select count(*) from auth_user").fetchone()[0] == 1


def _request(
    url: str, method: str = "GET", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _production_answers(base: str, env: dict[str, str], log: Path) -> None:
    """Issue 43 item 6, through gunicorn itself: HEAD where GET is, a JSON 414 for a URL
    gunicorn would have refused in HTML, and a bad Host as a JSON 400 logged on one
    WARNING line without a traceback."""
    token = manage(env, "api_token", "create", "serve-t", "--scope", "read").stdout
    auth = {"Authorization": f"Bearer {token.strip()}"}
    status, headers, body = _request(f"{base}/api/v1/work-items", "HEAD", **auth)
    assert status == 200 and headers["Content-Type"] == "application/json", body
    # past gunicorn's default 4094-character line: Django answers, not gunicorn's HTML 414
    status, headers, body = _request(
        f"{base}/api/v1/work-items?project={'p' * 5000}", **auth
    )
    assert status == 200, body
    status, headers, body = _request(
        f"{base}/api/v1/work-items?project={'p' * 9000}", **auth
    )
    assert status == 414 and json.loads(body)["error"].startswith(
        "request URI too long"
    )
    status, _, body = _request(f"{base}/api/v1/work-items", Host="scanner.invalid")
    assert status == 400 and json.loads(body) == {"error": "bad request"}
    text = wait_until(
        lambda: (lambda t: t if "scanner.invalid" in t else None)(log.read_text()),
        timeout=30,
        what="the bad Host logged",
    )
    lines = [line for line in text.splitlines() if "scanner.invalid" in line]
    assert len(lines) == 1 or all("GET /api" in line for line in lines[1:]), lines
    assert "Traceback" not in text and "DisallowedHost" not in text, text[-3000:]


def _answers(base: str) -> bool:
    try:
        urllib.request.urlopen(f"{base}/healthz", timeout=5)
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _browse_admin_and_ops(tmp_path: Path, base: str) -> list[str]:
    """Sign in through the admin in Chromium at 1400 px; the CSS and scripts the admin index
    and /ops/ loaded (absolute URLs)."""
    from selenium.webdriver.common.by import By

    from tests.routing.ops.browser import start_chromium, visit, wait_until_shown

    driver = start_chromium(tmp_path / "chromium-profile")
    try:
        driver.set_window_size(1400, 1000)
        visit(driver, f"{base}/admin/login/?next=/admin/", "input[name=username]")
        driver.find_element(By.NAME, "username").send_keys(STAFF_USER)
        driver.find_element(By.NAME, "password").send_keys(STAFF_PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        wait_until_shown(
            driver,
            "the admin index after login",
            lambda d: (
                d.current_url.rstrip("/").endswith("/admin")
                and d.execute_script("return document.readyState") == "complete"
                and d.find_elements(By.ID, "header")
            ),
        )
        assert driver.execute_script("return window.innerWidth") == 1400
        # the admin's stylesheet applied: its header has the admin's colours, not none
        header = driver.execute_script(
            "return getComputedStyle(document.getElementById('header')).backgroundColor"
        )
        assert header not in ("", "rgba(0, 0, 0, 0)", "transparent"), header
        assets = driver.execute_script(
            "return Array.from(document.querySelectorAll('link[rel=stylesheet]'))"
            ".map(l => l.href)"
        )
        visit(driver, f"{base}/ops/", "#refresh")
        assert "Operations" in driver.title, driver.title
        assets += driver.execute_script(
            "return Array.from(document.scripts).filter(s => s.src).map(s => s.src)"
            ".concat(Array.from(document.querySelectorAll('link[rel=stylesheet]'))"
            ".map(l => l.href))"
        )
        # every script the page names loaded without error in the browser
        failed = driver.execute_script(
            "return performance.getEntriesByType('resource')"
            ".filter(e => e.responseStatus && e.responseStatus >= 400).map(e => e.name)"
        )
        assert failed == [], failed
        (tmp_path / "ops.png").write_bytes(driver.get_screenshot_as_png())
        return sorted(set(assets))
    finally:
        driver.quit()
