"""Several machines on one: each simulated host is a run qcluster of its own, with its own
LOOPSWEB_HOST_NAME, data directory, worktree directory and project roots, against the one
database of the test (PostgreSQL in the tests that use this)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from tests.ledger.runner_helpers import child_database_url
from tests.processes import (
    MANAGE_PY,
    scratch_cwd,
    start_qcluster,
    stop_process_group,
    terminal_env,
)


@dataclass
class SimHost:
    name: str
    base: Path
    roots: list[Path]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)
    # This host's own view of paths (root only): directory bound over a path, in a mount
    # namespace of its own (`unshare --mount`), so two hosts see different disks there.
    binds: dict[Path, Path] = field(default_factory=dict)
    # A PID namespace of its own at each start (root only: `unshare --pid --fork`), as a
    # container has: its qcluster is pid 1 every time, and its workers' pids repeat.
    own_pids: bool = False
    # Another machine's node name (root only: `unshare --uts`): another machine id.
    node_name: str | None = None

    @property
    def worktrees(self) -> Path:
        return self.base / "worktrees"

    def start(self) -> SimHost:
        log = self.base / f"run-cluster-{len(self.logs)}.log"
        self.logs.append(log)
        if not self.binds and not self.own_pids and self.node_name is None:
            self.proc = start_qcluster(self.env, log, cluster="loopsweb-runs")
            return self
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.namespaced(f"{shlex.quote(MANAGE_PY)} qcluster"),
                cwd=scratch_cwd(),
                env={**self.env, "Q_CLUSTER_NAME": "loopsweb-runs"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def namespaced(self, manage_args: str) -> list[str]:
        """`manage.py <manage_args>` in this host's namespaces (binds, PIDs, node name)."""
        steps = [
            f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(dst))}"
            for src, dst in self.binds.items()
        ]
        if self.node_name is not None:
            steps.append(f"hostname {shlex.quote(self.node_name)}")
        steps.append(f"exec {shlex.quote(sys.executable)} {manage_args}")
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if self.own_pids:
            unshare += ["--pid", "--fork", "--mount-proc"]
        if self.node_name is not None:
            unshare.append("--uts")
        return [*unshare, "sh", "-c", " && ".join(steps)]

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)

    def kill(self) -> None:
        """SIGKILL the cluster's whole process group (the machine is gone)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def host_env(base: Path, name: str, roots: list[Path], **extra: str) -> dict[str, str]:
    (base / "data").mkdir(parents=True, exist_ok=True)
    return terminal_env(
        base / "data",
        SECRET_KEY=settings.SECRET_KEY,
        DATABASE_URL=child_database_url(),
        LOOPSWEB_HOST_NAME=name,
        LOOPSWEB_PROJECT_ROOTS=",".join(str(r) for r in roots),
        LOOPSWEB_WORKTREE_DIR=str(base / "worktrees"),
        **extra,
    )


def sim_host(tmp: Path, name: str, roots: list[Path], **extra: str) -> SimHost:
    base = tmp / name
    for root in roots:
        root.mkdir(parents=True, exist_ok=True)
    return SimHost(
        name=name, base=base, roots=roots, env=host_env(base, name, roots, **extra)
    )


def main_cluster(tmp: Path, **extra: str) -> subprocess.Popen[bytes]:
    """The main qcluster (schedules: lease recovery, grace, prune), on a host of its own."""
    base = tmp / "main"
    env = host_env(base, "main", [], Q_WORKERS="2", **extra)
    return start_qcluster(env, base / "main-cluster.log")
