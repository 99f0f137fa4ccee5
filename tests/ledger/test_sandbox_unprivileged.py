"""The agent sandbox when loopsweb runs as an ordinary user (docs/isolation.md §7): bwrap then
builds its namespaces inside a user namespace. The suite runs as root in CI; this test runs a
step the way the runner does (`ledger.processes.run_process` with the step's sandbox) in a
process of uid 65534, whose own files (its data dir's secrets, its database, another
account's env file) only the sandbox can hide from the probing agent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import hang_deadline

pytestmark = [pytest.mark.slow, pytest.mark.sandboxed]

CHECKOUT = Path(__file__).resolve().parents[2]
PROBE_AGENT = CHECKOUT / "tests" / "probe_agent.py"
UID = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

STEP = """
import json, os, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from ledger.processes import run_process
from ledger.providers import Invocation
from ledger.sandbox import sandbox_problem, step_sandbox
assert sandbox_problem() is None, sandbox_problem()
work, probe, env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
box = step_sandbox(provider="codewith", binary=probe, root=work, common_dir=None,
                   account_env={})
result = run_process(
    invocation=Invocation(argv=[probe], cwd=work, env=env, sandbox=box),
    timeout_seconds=120, idle_timeout_seconds=None, tail_bytes=65536, grace_seconds=1,
    on_spawn=lambda pid: None, keep_alive=lambda: True, keep_alive_every=60,
)
print(json.dumps({"exit": result.exit_code, "stdout": result.stdout,
                  "stderr": result.stderr, "ended": result.ended, "uid": os.getuid()}))
"""


def _readable_by_others(path: Path) -> bool:
    for part in [path, *path.parents]:
        if not os.stat(part).st_mode & 0o005:
            return False
    return True


@pytest.fixture
def base() -> Iterator[Path]:
    # Not under pytest's base temp dir: root's is private (0700) to other users.
    found = Path(tempfile.mkdtemp(prefix="loopsweb-unprivileged-"))
    os.chown(found, UID, UID)
    try:
        yield found
    finally:
        shutil.rmtree(found, ignore_errors=True)


def test_as_an_unprivileged_user_the_probing_agent_reaches_nothing_outside_its_run(
    base: Path,
) -> None:
    if os.getuid() != 0:
        pytest.skip(
            "the suite itself runs unprivileged: every sandboxed test is this one"
        )
    site = Path(sysconfig.get_paths()["purelib"])
    if not os.access(SYSTEM_PYTHON, os.X_OK) or not all(
        _readable_by_others(p) for p in (CHECKOUT, site)
    ):
        pytest.skip(
            f"uid {UID} cannot read the checkout or its packages, or there is no "
            f"{SYSTEM_PYTHON}"
        )
    data, work = base / "data", base / "work"
    for path in (data, work):
        path.mkdir()
    secrets = {
        data / "secret_key": "the installation's key\n",
        data / "loopsweb.env": "LOOPSWEB_HTTPS=0\n",
        base / "other.env": "OPENAI_API_KEY=sk-other\n",
    }
    for path, text in secrets.items():
        path.write_text(text)
        path.chmod(0o600)
    for path in [*secrets, data, work]:
        os.chown(path, UID, UID)
    mark = f"loopsweb-unprivileged-mark-{os.getpid()}"
    step_env = {
        "PATH": "/usr/bin:/bin",
        "LOOPSWEB_STEP_ID": "worker",
        "PROBE_READ": ",".join(str(p) for p in [*secrets, data / "db.sqlite3"]),
        "PROBE_LIST": f"{data},{CHECKOUT}",
        "PROBE_WRITE": f"{data},{CHECKOUT}",
        "PROBE_MARK": mark,
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(base),
        "PYTHONPATH": f"{CHECKOUT}{os.pathsep}{site}",
        "DJANGO_SETTINGS_MODULE": "loopsweb.settings",
        "DEBUG": "1",
        "SECRET_KEY": "unprivileged-test",
        "LOOPSWEB_DATA_DIR": str(data),
        "DATABASE_URL": f"sqlite:///{data / 'db.sqlite3'}",
    }
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={UID}",
            f"--regid={UID}",
            "--clear-groups",
            SYSTEM_PYTHON,
            "-c",
            STEP,
            str(work),
            str(PROBE_AGENT),
            json.dumps(step_env),
        ],
        cwd=base,
        env=env,
        capture_output=True,
        text=True,
        timeout=hang_deadline(300),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["uid"] == UID
    assert result["exit"] == 0, result["stderr"]
    probes = [
        line for line in result["stdout"].splitlines() if line.startswith("PROBE ")
    ]
    assert len(probes) >= 8, result["stdout"]
    # Writes are judged on the host below: inside, /tmp (where this base dir lies) is the
    # sandbox's own.
    reached = [
        line
        for line in probes
        if ": REACHED" in line and not line.startswith("PROBE write ")
    ]
    assert reached == [], "\n".join(reached)
    assert not list(CHECKOUT.glob("probe-*"))
    assert (work / "probe-work-worker.txt").read_text() == "work of step worker\n"
    assert sorted(p.name for p in data.iterdir()) == sorted(
        ["secret_key", "loopsweb.env", "db.sqlite3"]
    )
    assert result["ended"] >= 1  # the setsid daemon, ended with the step
