"""The agent sandbox's rules (runs.sandbox, agents.egress; docs/isolation.md §7): a host
without bubblewrap refuses write-enabled routes and says so everywhere; operator binds that
would expose a protected path are refused; the egress relay lets out only what a rule allows,
and counts what it refused."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agents import egress
from ledger.models import WorkflowWorkItem
from runs import sandbox
from runs.processes import Limits, run_process
from runs.providers import Invocation
from tests.ledger.runner_helpers import git_project
from tests.processes import manage, terminal_env
from tests.waiting import wait_for

pytestmark = pytest.mark.sandboxed


@pytest.fixture
def no_bwrap_path(tmp_path: Path) -> str:
    """A PATH with git and the shell tools, and no bwrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("git", "sh", "env", "true"):
        found = shutil.which(name)
        if found:
            (bin_dir / name).symlink_to(found)
    return str(bin_dir)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_without_bwrap_a_write_enabled_route_is_refused_and_health_says_why(
    tmp_path: Path, no_bwrap_path: str
) -> None:
    from tests.ledger.runner_helpers import child_database_url

    project = git_project(tmp_path / "project")
    env = terminal_env(
        tmp_path / "data",
        SECRET_KEY=settings.SECRET_KEY,
        DATABASE_URL=child_database_url(),
    )
    env.pop("LOOPSWEB_AGENT_SANDBOX", None)
    env["PATH"] = no_bwrap_path
    event = {
        "id": "evt-no-bwrap",
        "type": "build.failed",
        "source": "ci",
        "data": {"project_path": str(project), "title": "Fix it"},
    }
    done = manage(
        env, "route_event", "generic", "--event-json", json.dumps(event), check=False
    )
    assert done.returncode != 0
    assert "bubblewrap (bwrap) is not installed" in done.stderr
    assert "apt-get install bubblewrap" in done.stderr
    assert not WorkflowWorkItem.objects.exists()  # nothing written

    health = manage(env, "health", "--json", check=False)
    body = json.loads(health.stdout)
    assert body["agentSandbox"] == "unavailable"
    assert any("bubblewrap" in line for line in body["problems"])

    deploy = manage(env, "check", "--deploy", check=False)
    assert "loopsweb.E001" in deploy.stdout + deploy.stderr

    # The operator's explicit choice runs agents unsandboxed, and says so.
    env["LOOPSWEB_AGENT_SANDBOX"] = "off"
    allowed = manage(
        env, "route_event", "generic", "--event-json", json.dumps(event), "--json"
    )
    assert json.loads(allowed.stdout)["run"]["id"]
    deploy = manage(env, "check", "--deploy", check=False)
    assert "loopsweb.W001" in deploy.stdout + deploy.stderr


@pytest.mark.slow  # the page's check runs bwrap once
@pytest.mark.django_db
def test_every_operator_page_shows_a_sandbox_that_cannot_run_or_is_off(
    admin_client: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LOOPSWEB_AGENT_SANDBOX = "bwrap"
    monkeypatch.setattr(sandbox, "bwrap_binary", lambda: None)
    for page in ("/ops/", "/admin/"):
        body = admin_client.get(page).content.decode()
        assert 'id="agent-sandbox-warning"' in body
        assert "bubblewrap (bwrap) is not installed" in body
    settings.LOOPSWEB_AGENT_SANDBOX = "off"
    body = admin_client.get("/ops/").content.decode()
    assert "agents run unsandboxed" in body
    monkeypatch.undo()
    settings.LOOPSWEB_AGENT_SANDBOX = "bwrap"
    assert (
        'id="agent-sandbox-warning"' not in admin_client.get("/ops/").content.decode()
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "setting_path",
    ["DATA_DIR", "BASE_DIR", "HOME", "WORKTREES"],
)
def test_an_operator_bind_that_exposes_a_protected_path_is_refused(
    settings: Any, setting_path: str
) -> None:
    path = {
        "DATA_DIR": str(settings.DATA_DIR),
        "BASE_DIR": str(Path(settings.BASE_DIR) / "ledger"),
        "HOME": "/",
        "WORKTREES": str(Path(settings.LOOPSWEB_WORKTREE_DIR).parent),
    }[setting_path]
    settings.LOOPSWEB_AGENT_SANDBOX_RO_BIND = [path]
    problem = sandbox.operator_bind_problem()
    assert problem is not None and path in problem
    settings.LOOPSWEB_AGENT_SANDBOX_RO_BIND = []
    settings.LOOPSWEB_AGENT_SANDBOX_BIND = ["/opt/shared-cache"]
    assert sandbox.operator_bind_problem() is None


def test_egress_rules() -> None:
    rules = [
        egress.parse_rule(t) for t in ("127.0.0.1:8123", "*.example.com", "api.x.io")
    ]
    assert egress.allowed(rules, "127.0.0.1", 8123)
    assert not egress.allowed(rules, "127.0.0.1", 8000)  # loopsweb's web server
    assert not egress.allowed(rules, "127.0.0.1", 5432)  # its database
    assert egress.allowed(rules, "pkg.example.com", 443)
    assert not egress.allowed(rules, "example.com", 443)
    assert not egress.allowed(rules, "pkg.example.com", 22)
    assert not egress.allowed(rules, "evil.io", 443)
    for bad in ("", "host:99999", "a b", "user@host", "[::1"):
        with pytest.raises(ValueError):
            egress.parse_rule(bad)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b"hello from the endpoint"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


@pytest.mark.slow
@pytest.mark.django_db
def test_a_sandboxed_step_reaches_its_endpoint_and_nothing_else(
    tmp_path: Path, endpoint: int, settings: Any
) -> None:
    """A step reaches its account's loopback endpoint (forwarded into its namespace), not a
    loopback service that is no endpoint, not a host no rule names (counted as refused)."""
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    work = tmp_path / "work"
    work.mkdir()
    script = (
        "import os, socket, urllib.request\n"
        f"print(urllib.request.urlopen('http://127.0.0.1:{endpoint}/').read().decode())\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {other.getsockname()[1]}), 3)\n"
        "    print('OTHER REACHED')\n"
        "except OSError as exc:\n"
        "    print('other refused', exc.errno)\n"
        "try:\n"
        "    urllib.request.urlopen('https://not-allowed.example/', timeout=5)\n"
        "except Exception as exc:\n"
        "    print('proxy refused', exc)\n"
        "open('done.txt', 'w').write('ok')\n"
    )
    box = sandbox.step_sandbox(
        provider="claude",
        binary="/usr/bin/python3",
        root=str(work),
        common_dir=None,
        account_env={"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{endpoint}"},
    )
    invocation = Invocation(
        argv=["/usr/bin/python3", "-c", script],
        cwd=str(work),
        env={"PATH": os.environ["PATH"], "HOME": str(Path.home())},
        sandbox=box,
    )
    result = run_process(
        invocation=invocation,
        limits=Limits(
            timeout_seconds=120, tail_bytes=65536, grace_seconds=1, keep_alive_every=60
        ),
    )
    other.close()
    assert result.exit_code == 0, result.stderr
    assert "hello from the endpoint" in result.stdout
    assert "OTHER REACHED" not in result.stdout and "other refused" in result.stdout
    assert "proxy refused" in result.stdout
    assert result.egress_refused == {"not-allowed.example:443": 1}
    assert (work / "done.txt").read_text() == "ok"


@pytest.mark.slow
@pytest.mark.django_db
def test_without_a_worktree_the_projects_git_dir_stays_read_only(
    tmp_path: Path,
) -> None:
    """A step that works in the project itself (no worktree) can write its files, not its
    git dir: the config, hooks and refs that loopsweb and the operator's git read."""
    project = git_project(tmp_path / "project")
    script = (
        "import pathlib\n"
        "pathlib.Path('work.txt').write_text('work')\n"
        "try:\n"
        "    open('.git/config', 'a').write('[core]\\n\\tfsmonitor = evil\\n')\n"
        "    print('CONFIG WRITTEN')\n"
        "except OSError as exc:\n"
        "    print('config refused', exc.errno)\n"
    )
    box = sandbox.step_sandbox(
        provider="codex",
        binary="/usr/bin/python3",
        root=str(project),
        common_dir=None,
        account_env={},
    )
    result = run_process(
        invocation=Invocation(
            argv=["/usr/bin/python3", "-c", script],
            cwd=str(project),
            env={"PATH": os.environ["PATH"]},
            sandbox=box,
        ),
        limits=Limits(
            timeout_seconds=120, tail_bytes=65536, grace_seconds=1, keep_alive_every=60
        ),
    )
    assert result.exit_code == 0, result.stderr
    assert "config refused" in result.stdout
    assert (project / "work.txt").read_text() == "work"
    assert "evil" not in (project / ".git" / "config").read_text()


def _relayed(path: Path, port: int) -> socket.socket | None:
    """A connection through the relay at `path` to 127.0.0.1:`port`, or None if closed."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    try:
        conn.connect(str(path))
        conn.sendall(f"127.0.0.1 {port}\n".encode())
        if conn.recv(3) == b"OK\n":
            return conn
    except OSError:
        pass
    conn.close()
    return None


@pytest.mark.slow  # waits for the freed slot
def test_the_relay_holds_at_most_its_connection_limit_open(tmp_path: Path) -> None:
    """Each relayed connection is a thread of the runner: a step that opens more than
    MAX_CONNECTIONS at once has the rest closed, so it cannot spend the worker's threads."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(256)
    port = server.getsockname()[1]
    path = tmp_path / "egress.sock"
    relay, listener = egress.start_outside(str(path), [("127.0.0.1", port)])
    held: list[socket.socket] = []
    try:
        for _ in range(egress.MAX_CONNECTIONS):
            conn = _relayed(path, port)
            assert conn is not None
            held.append(conn)
        assert _relayed(path, port) is None  # closed at once, before any answer
        held.pop().close()
        # A slot frees once the closed connection's relay has ended.
        held.append(wait_for(lambda: _relayed(path, port), what="a free relay slot"))
    finally:
        for conn in held:
            conn.close()
        listener.close()
        server.close()
    assert relay.refused == {}
