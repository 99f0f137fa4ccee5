"""Runs with the real CLIs against the provider stand-in, shared by the tests of tests/agents/:
a run routed and run in this process's ledger (`route_run`, the runner tests), or a task
drained over a pool of two registered accounts (`KEYS`) and run by the run cluster, a
process of its own (`drain_and_run`, the tests through the processes)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from ledger.models import RunStatus, WorkflowRun
from routing.admission import CREATED, route_event, route_options
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.ledger.runner_helpers import child_database_url, git, git_project
from tests.processes import (
    manage,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)

# The pool `drain_and_run` registers: account name -> its key at the stand-in.
KEYS = {"acct-a": "key-of-acct-a-0123", "acct-b": "key-of-acct-b-4567"}


def route_run(
    project: Path, provider: str, event_id: str | None = None, **raw: Any
) -> WorkflowRun:
    """Route a generic event on `project` in this process; its run, created (not run)."""
    event = {
        "id": event_id or f"evt-{time.time_ns()}",
        "type": "build.failed",
        "source": "ci",
        "data": {
            "project_path": str(project),
            "title": "Write agent-output.txt",
            "message": "Write the file agent-output.txt in the working directory.",
        },
    }
    result = route_event(
        kind="generic",
        envelope=event,
        options=route_options({"provider": provider, **raw}),
        env={},
    )
    assert result.kind == CREATED and result.run is not None, result.to_dict()
    return result.run


def task_event(project: Path, provider: str) -> dict[str, object]:
    """A todos task on `project` asking for agent-output.txt (`manage.py ingest_events`)."""
    return {
        "id": f"evt-{provider}-1",
        "type": "task.created",
        "source": "@hasna/todos",
        "data": {
            "id": f"REAL-{provider}",
            "title": "Write agent-output.txt",
            "description": "Write the file agent-output.txt in the working directory.",
            "tags": ["auto:route"],
            "project_path": str(project),
        },
    }


def bare_origin(tmp_path: Path) -> tuple[Path, Callable[[Path], None]]:
    """A bare repository on local disk, and the `project_setup` of `drain_and_run` that makes
    it the project's `origin` with main pushed to it."""
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))

    def with_origin(project: Path) -> None:
        git(project, "remote", "add", "origin", str(origin))
        git(project, "push", "-q", "origin", "main")

    return origin, with_origin


def env_file(path: Path, line: str) -> Path:
    """A 0600 env file of one `NAME=value` line (a token or a secret file's shape)."""
    path.write_text(line + "\n")
    path.chmod(0o600)
    return path


def run_env(provider: str, cli_bin: Path, **extra: str) -> dict[str, str]:
    """The environment of the suite's processes (`manage.py`, the run cluster): the test
    database, two run workers, `provider`'s pinned binary."""
    return terminal_env(
        Path(settings.DATA_DIR),
        SECRET_KEY=settings.SECRET_KEY,
        DATABASE_URL=child_database_url(),
        LOOPSWEB_RUN_WORKERS="2",
        **{
            f"LOOPSWEB_{provider.upper()}_BIN": str(
                cli_bin / clis.CLI_PACKAGES[provider][2]
            )
        },
        **extra,
    )


def drain_and_run(
    provider: str,
    cli_bin: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    *,
    env_extra: dict[str, str] | None = None,
    timeout: float = 240,
    removed: bool = True,
    drain_args: tuple[str, ...] = (),
    project_setup: Callable[[Path], None] | None = None,
) -> WorkflowRun:
    """Register acct-a and acct-b, ingest a task, drain it over the pool in a `manage.py
    drain` process, and wait for the run cluster to finish the run (and, with `removed`,
    to remove the worktree of a run that succeeded)."""
    for name, key in KEYS.items():
        clis.register_account(provider, name, stand_in, tmp_path, key=key)
    project = git_project(tmp_path / "project")
    if project_setup is not None:
        project_setup(project)
    env = run_env(provider, cli_bin, **(env_extra or {}))
    event = tmp_path / "task.json"
    event.write_text(json.dumps(task_event(project, provider)))
    cluster = start_qcluster(env, tmp_path / "runs.log", cluster="loopsweb-runs")
    try:
        manage(env, "ingest_events", str(event))
        done = manage(
            env,
            "drain",
            "todos-task",
            "--auth-profile-pool",
            "acct-a,acct-b",
            "--provider",
            provider,
            "--max-active",
            "2",
            "--json",
            *drain_args,
        )
        assert '"created": 1' in done.stdout, done.stdout

        def finished() -> WorkflowRun | None:
            assert cluster.poll() is None, (tmp_path / "runs.log").read_text()[-3000:]
            return WorkflowRun.objects.filter(
                status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT]
            ).first()

        run = wait_until(finished, timeout=timeout, what=f"the {provider} run to end")
        if removed:
            # The worktree goes after the run's end is recorded.
            wait_until(
                lambda: (
                    WorkflowRun.objects.get(pk=run.id).worktree_removed_at is not None
                    or run.status != RunStatus.SUCCEEDED
                ),
                timeout=30,
                what="the worktree to be removed",
            )
    finally:
        stop_process_group(cluster)
    run.refresh_from_db()
    return run
