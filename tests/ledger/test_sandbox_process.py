"""An agent sees only its run (docs/isolation.md §7): a probing agent stand-in
(tests/probe_agent.py) runs through `manage.py route_event` (a second terminal) and a run
cluster as `make run` starts it, and through `manage.py run_workflow`, under the default
settings (the bwrap sandbox). Every probe of what must stay hidden is blocked, the agent's work
is on its branch, and no process of its step is alive 10 s after the step ended.

The suite runs as root: what is not bound does not exist in the sandbox whatever the uid."""

from __future__ import annotations

import json
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from ledger.models import TERMINAL_RUN_STATUSES, Host, RunStatus, WorkflowRun
from runs.worktrees import worktree_branch
from tests.ledger.runner_helpers import child_database_url, git, git_project, steps_of
from tests.probing import breaches
from tests.processes import (
    manage,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.sandboxed,
]

PROBE_AGENT = Path(__file__).resolve().parents[1] / "probe_agent.py"
CHECKOUT = Path(__file__).resolve().parents[2]


def _marked_alive(mark: str) -> list[int]:
    """Host pids whose argv carries `mark` (zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark.encode() not in (entry / "cmdline").read_bytes():
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] != "Z":
            found.append(int(entry.name))
    return found


class Secrets:
    """What the probe must not reach: loopsweb's data dir with its secrets, another
    account's login and env file, the GitHub token, another run's worktree, the checkout and
    venv, the operator's home, the host's /tmp, a loopback service that is no endpoint."""

    def __init__(self, base: Path) -> None:
        self.data = base / "data"
        self.data.mkdir(parents=True)
        (self.data / "secret_key").write_text("the installation's development key\n")
        (self.data / "loopsweb.env").write_text(
            "# the installation's settings\nLOOPSWEB_HTTPS=0\n"
        )
        self.other = base / "other-account"
        self.other.mkdir()
        (self.other / "auth.json").write_text('{"token": "other account"}\n')
        self.other_env = base / "other.env"
        self.other_env.write_text("OPENAI_API_KEY=sk-other\n")
        self.token = base / "github-token"
        self.token.write_text("GITHUB_TOKEN=ghp_secret\n")
        self.worktrees = base / "worktrees"
        self.victim = self.worktrees / "other-run"
        self.victim.mkdir(parents=True)
        (self.victim / "work.txt").write_text("another run's work\n")
        self.host_tmp = Path("/tmp") / f"loopsweb-probe-{uuid.uuid4().hex}"
        self.host_tmp.write_text("the host's /tmp\n")
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.mark = f"loopsweb-probe-mark-{uuid.uuid4().hex}"

    def environment(self, project: Path) -> dict[str, str]:
        database = settings.DATABASES["default"]
        reads = [
            self.data / "secret_key",
            self.data / "loopsweb.env",
            self.other / "auth.json",
            self.other_env,
            self.token,
            self.victim / "work.txt",
            CHECKOUT / "manage.py",
            Path(sys.prefix) / "pyvenv.cfg",
            self.host_tmp,
            Path.home() / ".bashrc",
        ]
        if "sqlite" in database["ENGINE"]:
            reads.append(Path(str(database["NAME"])))
        return {
            "PROBE_READ": ",".join(map(str, reads)),
            "PROBE_LIST": ",".join(
                map(
                    str,
                    [self.data, self.worktrees, CHECKOUT, Path.home(), "/etc/loopsweb"],
                )
            ),
            "PROBE_WRITE": ",".join(
                map(
                    str,
                    [
                        CHECKOUT,
                        Path(sys.prefix),
                        project / ".git" / "config",
                        self.victim,
                        Path.home(),
                    ],
                )
            ),
            "PROBE_CONNECT": f"127.0.0.1:{self.listener.getsockname()[1]}",
            "PROBE_URL": "https://exfiltrate.example/",
            "PROBE_SIGNAL": str(os.getpid()),
            "PROBE_MARK": self.mark,
        }

    def close(self) -> None:
        self.listener.close()
        self.host_tmp.unlink(missing_ok=True)


class Installation:
    """A run cluster on the test database with the probing agent as codewith, its targets
    in the cluster's environment (the agent's environment is the run cluster's)."""

    def __init__(self, base: Path, project: Path) -> None:
        base.mkdir()
        self.base = base
        self.project = project
        self.secrets = Secrets(base)
        self.env = terminal_env(
            self.secrets.data,
            SECRET_KEY=settings.SECRET_KEY,
            DATABASE_URL=child_database_url(),
            LOOPSWEB_CODEWITH_BIN=str(PROBE_AGENT),
            LOOPSWEB_AGENT_ENV_PASSTHROUGH="PROBE_*",
            LOOPSWEB_WORKTREE_DIR=str(self.secrets.worktrees),
            LOOPSWEB_GITHUB_TOKEN_FILE=str(self.secrets.token),
        )
        self.env.pop("LOOPSWEB_AGENT_SANDBOX", None)  # the product's default
        self.env.update(self.secrets.environment(project))
        self.cluster = start_qcluster(
            self.env, base / "runs.log", cluster="loopsweb-runs"
        )

    def route(self) -> str:
        event = {
            "id": f"evt-probe-{uuid.uuid4().hex[:8]}",
            "type": "build.failed",
            "source": "ci",
            "data": {"project_path": str(self.project), "title": "Look around"},
        }
        done = manage(
            self.env,
            "route_event",
            "generic",
            "--event-json",
            json.dumps(event),
            "--json",
        )
        return str(json.loads(done.stdout)["run"]["id"])

    def ended(self, run_id: str) -> WorkflowRun:
        def found() -> WorkflowRun | None:
            run = WorkflowRun.objects.get(pk=run_id)
            return run if run.status in TERMINAL_RUN_STATUSES else None

        return wait_until(found, what=f"run {run_id} to end")


@pytest.fixture
def installation(tmp_path: Path) -> Iterator[Installation]:
    inst = Installation(tmp_path / "installation", git_project(tmp_path / "project"))
    try:
        yield inst
    finally:
        stop_process_group(inst.cluster)
        inst.secrets.close()


def _assert_isolated(inst: Installation, project: Path, run: WorkflowRun) -> None:
    assert run.status == RunStatus.SUCCEEDED, run.error
    worker = steps_of(run)["worker"]
    probes = [line for line in worker.stdout.splitlines() if line.startswith("PROBE ")]
    assert len(probes) >= 20, worker.stdout + worker.stderr
    reached = breaches(probes, str(run.worktree_path))
    assert reached == [], "\n".join(reached)
    for line in probes:
        if line.startswith("PROBE write "):
            target = line.split(" (", 1)[1].rstrip(")")
            written = Path(target)
            assert not (written.is_file() and "probing agent" in written.read_text()), (
                line
            )
    # The agent's work is on its branch.
    files = git(
        project, "ls-tree", "-r", "--name-only", worktree_branch(run.id)
    ).split()
    assert {"probe-work-worker.txt", "probe-work-verifier.txt"} <= set(files)
    # Nothing of it written outside the run.
    assert not list(CHECKOUT.glob("probe-*"))
    assert not list(Path.home().glob("probe-*"))
    assert sorted(p.name for p in inst.secrets.victim.iterdir()) == ["work.txt"]
    assert "probing agent" not in (project / ".git" / "config").read_text()
    # The proxy refused the host no rule names, and the step says so.
    assert worker.egress_refused == {"exfiltrate.example:443": 1}
    # The daemon that killed its supervisor is gone with the step (well within 10 s).
    assert worker.processes_ended is not None and worker.processes_ended >= 1
    wait_until(
        lambda: not _marked_alive(inst.secrets.mark),
        what="the probe's setsid daemon to be gone",
        timeout=10,
    )


def test_through_the_run_cluster_the_probing_agent_reaches_nothing_outside_its_run(
    installation: Installation, admin_client: Any
) -> None:
    run = installation.ended(installation.route())
    _assert_isolated(installation, installation.project, run)
    # The item page and the API show what the sandbox refused to let out.
    page = admin_client.get(f"/ops/items/{run.work_item_id}/").content.decode()
    assert "egress refused: 1 host" in page and "exfiltrate.example:443 (1)" in page
    api = admin_client.get(f"/api/v1/work-items/{run.work_item_id}").json()
    (found,) = [r for r in api["runs"] if r["id"] == run.id]
    worker = next(s for s in found["steps"] if s["stepId"] == "worker")
    assert worker["egressRefused"] == {"exfiltrate.example:443": 1}


def test_through_run_workflow_the_probing_agent_reaches_nothing_outside_its_run(
    installation: Installation,
) -> None:
    # The run cluster registered this host (what admission checks), then stopped: the
    # run waits queued, and a second terminal runs it in-process.
    wait_until(
        lambda: Host.objects.exists(), what="the run cluster to register its host"
    )
    stop_process_group(installation.cluster)
    run_id = installation.route()
    done = manage(installation.env, "run_workflow", run_id, timeout=600)
    assert "succeeded" in done.stdout, done.stdout + done.stderr
    _assert_isolated(installation, installation.project, installation.ended(run_id))
