"""The agent sandbox when loopsweb runs as an ordinary user (docs/isolation.md §7): bwrap then
builds its namespaces inside a user namespace. The suite runs as root in CI; here a whole
installation runs as uid 65534 (its SQLite database, data dir and project its own): `migrate`,
a run cluster as `make run` starts it, `route_event` from a second terminal, then
`run_workflow` with the cluster stopped, with the probing agent (tests/probe_agent.py) as
codewith. Its files (the data dir's secrets and
database, another account's env file) are readable by that uid, so only the sandbox hides
them from the agent."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ledger.runner_helpers import git_project
from tests.probing import breaches
from tests.processes import stop_process_group
from tests.waiting import hang_deadline
from tests.waiting import wait_for as wait_until

pytestmark = [pytest.mark.slow, pytest.mark.sandboxed]

CHECKOUT = Path(__file__).resolve().parents[2]
PROBE_AGENT = CHECKOUT / "tests" / "probe_agent.py"
UID = 65534
SYSTEM_PYTHON = "/usr/bin/python3"


def _readable_by_others(path: Path) -> bool:
    return all(os.stat(part).st_mode & 0o005 for part in [path, *path.parents])


@pytest.fixture
def base() -> Iterator[Path]:
    # Not under pytest's base temp dir: root's is private (0700) to other users.
    found = Path(tempfile.mkdtemp(prefix="loopsweb-unprivileged-"))
    try:
        yield found
    finally:
        shutil.rmtree(found, ignore_errors=True)


class Unprivileged:
    """An installation of uid UID: its commands run through `setpriv`."""

    def __init__(self, base: Path) -> None:
        site = Path(sysconfig.get_paths()["purelib"])
        self.base = base
        self.data = base / "data"
        self.data.mkdir()
        self.project = git_project(base / "projects" / "demo")
        self.secrets = {
            self.data / "secret_key": "the installation's key\n",
            self.data / "loopsweb.env": "LOOPSWEB_HTTPS=0\n",
            base / "other.env": "OPENAI_API_KEY=sk-other-account-key\n",
        }
        for path, text in self.secrets.items():
            path.write_text(text)
            path.chmod(0o600)
        subprocess.run(["chown", "-R", f"{UID}:{UID}", str(base)], check=True)
        self.database = self.data / "db.sqlite3"
        self.mark = f"loopsweb-unprivileged-mark-{os.getpid()}"
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(base),
            "PYTHONPATH": f"{CHECKOUT}{os.pathsep}{site}",
            "DEBUG": "1",
            "SECRET_KEY": "unprivileged-test-key",
            "LOOPSWEB_DATA_DIR": str(self.data),
            "DATABASE_URL": f"sqlite:///{self.database}",
            "LOOPSWEB_PROJECT_ROOTS": str(base / "projects"),
            "LOOPSWEB_CODEWITH_BIN": str(PROBE_AGENT),
            "LOOPSWEB_AGENT_ENV_PASSTHROUGH": "PROBE_*",
            "PROBE_READ": ",".join(
                str(p) for p in [*self.secrets, self.database, CHECKOUT / "manage.py"]
            ),
            "PROBE_LIST": f"{self.data},{CHECKOUT}",
            "PROBE_WRITE": f"{self.data},{CHECKOUT}",
            "PROBE_MARK": self.mark,
        }

    def argv(self, *args: str) -> list[str]:
        return [
            "setpriv",
            f"--reuid={UID}",
            f"--regid={UID}",
            "--clear-groups",
            SYSTEM_PYTHON,
            str(CHECKOUT / "manage.py"),
            *args,
        ]

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            self.argv(*args),
            cwd=self.base,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=hang_deadline(300),
        )
        assert done.returncode == 0, f"{args}: {done.stderr[-3000:]}"
        return done.stdout

    def route(self, event_id: str) -> str:
        """`route_event` of a generic event for the project, from a second terminal."""
        event = {
            "id": event_id,
            "type": "build.failed",
            "source": "ci",
            "data": {"project_path": str(self.project), "title": "Look around"},
        }
        out = self.manage(
            "route_event", "generic", "--event-json", json.dumps(event), "--json"
        )
        return str(json.loads(out)["run"]["id"])

    def ended(self, run_id: str) -> str | None:
        found = self.row("SELECT status FROM workflow_runs WHERE id = ?", run_id)
        status = str(found[0]) if found else None
        return (
            status
            if status in ("succeeded", "failed", "timed_out", "cancelled")
            else None
        )

    def row(self, sql: str, *params: str) -> tuple[object, ...] | None:
        """One row, read as root; None while the cluster holds a write lock."""
        try:
            with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True) as db:
                found: tuple[object, ...] | None = db.execute(sql, params).fetchone()
                return found
        except sqlite3.OperationalError:
            return None


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
    inst = Unprivileged(base)
    inst.manage("migrate", "--verbosity", "0")
    log = (base / "runs.log").open("wb")
    cluster = subprocess.Popen(
        inst.argv("qcluster"),
        cwd=base,
        env={**inst.env, "Q_CLUSTER_NAME": "loopsweb-runs"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: (
                inst.row("SELECT name FROM loopsweb_hosts LIMIT 1")
                if inst.database.exists()
                else None
            ),
            what="the unprivileged run cluster to register its host",
        )
        run_id = inst.route("evt-unprivileged-1")
        status = wait_until(lambda: inst.ended(run_id), what=f"run {run_id} to end")
    finally:
        stop_process_group(cluster)
        log.close()
    assert status == "succeeded", (base / "runs.log").read_text()[-3000:]
    _assert_isolated(inst, run_id)
    # A second terminal's `run_workflow`, the cluster stopped (its host still registered).
    again = inst.route("evt-unprivileged-2")
    out = inst.manage("run_workflow", again)
    assert "succeeded" in out, out
    assert inst.ended(again) == "succeeded"
    _assert_isolated(inst, again)


def _assert_isolated(inst: Unprivileged, run_id: str) -> None:
    stdout, ended = inst.row(
        "SELECT stdout, processes_ended FROM workflow_step_runs "
        "WHERE workflow_run_id = ? AND step_id = 'worker'",
        run_id,
    ) or ("", None)
    text = str(stdout)
    assert "as uid" in text and "as uid 0" not in text, text
    probes = [line for line in text.splitlines() if line.startswith("PROBE ")]
    assert len(probes) >= 8, text
    worktree = inst.row("SELECT worktree_path FROM workflow_runs WHERE id = ?", run_id)
    reached = breaches(probes, str(worktree[0] if worktree else ""))
    assert reached == [], "\n".join(reached)
    assert not list(CHECKOUT.glob("probe-*"))
    assert not [p for p in inst.data.iterdir() if p.name.startswith("probe-")]
    branch = subprocess.run(
        ["git", "-C", str(inst.project), "ls-tree", "-r", "--name-only",
         f"loopsweb/run-{run_id}"],
        capture_output=True, text=True, check=False,
        env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_GLOBAL": os.devnull,
             "GIT_CONFIG_PARAMETERS": "'safe.directory=*'"},
    ).stdout.split()  # fmt: skip
    assert "probe-work-worker.txt" in branch
    # The setsid daemon, ended with the step.
    assert isinstance(ended, int) and ended >= 1
