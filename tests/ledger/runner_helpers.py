"""Helpers for the runner tests: the fake agent, hand-written workflows, child processes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import DatabaseError, connection, connections
from django.utils import timezone

from agents.providers import PROVIDERS
from domain.templates import EVENT_WORKER_VERIFIER
from ledger import services
from ledger.lock import ADMISSION_KEY, ADVISORY_NAMESPACE
from ledger.models import (
    WorkflowEvent,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.services import work_item_admit
from routing.admission import RouteResult, route_event, route_options
from tests.processes import MANAGE_PY, scratch_cwd, start_make_run, terminal_env
from tests.routing.helpers import CreatedRoute, created_route
from tests.waiting import wait_for as wait_for  # the suite's one polling helper

ROOT = Path(__file__).resolve().parents[2]
FAKE_AGENT = ROOT / "scripts" / "fake-agent"
VENV_BIN = Path(sys.executable).parent

_seq = itertools.count(1)


@dataclass
class FakeAgent:
    """The fake agent wired in as every provider's binary, with its invocation records."""

    record_dir: Path
    tmp_path: Path
    monkeypatch: pytest.MonkeyPatch
    config: dict[str, Any] = field(default_factory=dict)

    def env(self, **values: str) -> None:
        for name, value in values.items():
            self.monkeypatch.setenv(f"FAKE_AGENT_{name.upper()}", value)

    def configure(
        self,
        *,
        default: dict[str, Any] | None = None,
        profiles: dict[str, dict[str, Any]] | None = None,
        steps: dict[str, dict[str, Any]] | None = None,
    ) -> Path:
        path = self.tmp_path / f"fake-agent-{next(_seq)}.json"
        path.write_text(
            json.dumps(
                {
                    "default": default or {},
                    "profiles": profiles or {},
                    "steps": steps or {},
                }
            )
        )
        self.monkeypatch.setenv("FAKE_AGENT_CONFIG", str(path))
        return path

    def records(self) -> list[dict[str, Any]]:
        files = sorted(self.record_dir.glob("*.json"))
        return [json.loads(f.read_text()) for f in files]


def install_fake_agent(
    settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> FakeAgent:
    """Every provider's binary is the fake agent; fast polls and short grace for tests."""
    record_dir = tmp_path / "agent-records"
    record_dir.mkdir()
    settings.LOOPSWEB_PROVIDER_BINARIES = {p: str(FAKE_AGENT) for p in PROVIDERS}
    settings.LOOPSWEB_KILL_GRACE_SECONDS = 0.3
    settings.LOOPSWEB_STEP_START_POLL_SECONDS = 0.05
    settings.LOOPSWEB_RUN_LEASE_SECONDS = 30
    settings.LOOPSWEB_COOLDOWN_BASE_SECONDS = 60
    settings.LOOPSWEB_COOLDOWN_CAP_SECONDS = 3600
    for name in list(os.environ):
        if name.startswith("FAKE_AGENT_"):
            monkeypatch.delenv(name)
    # `#!/usr/bin/env python3` finds the venv's python first: no pyenv shim per agent start.
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_AGENT_RECORD_DIR", str(record_dir))
    return FakeAgent(record_dir=record_dir, tmp_path=tmp_path, monkeypatch=monkeypatch)


def route_generic(
    project: Path,
    event_id: str | None = None,
    *,
    title: str = "Fix the build",
    message: str = "It broke",
    created: bool = False,
    **raw: Any,
) -> RouteResult:
    """Route one generic `build.failed` event for `project` with the routing options `raw`
    (as the route command takes them); a fresh event id unless `event_id` is given.
    `created=True`: the admission must have created a run."""
    event = {
        "id": event_id or f"evt-{time.time_ns()}",
        "type": "build.failed",
        "source": "ci",
        "data": {"project_path": str(project), "title": title, "message": message},
    }
    result = route_event(
        kind="generic", envelope=event, options=route_options(raw), env={}
    )
    if created:
        created_route(result)
    return result


def route_created(
    project: Path, event_id: str | None = None, **raw: Any
) -> CreatedRoute:
    """`route_generic` for an admission that must create its run: the rows it made."""
    return created_route(route_generic(project, event_id, **raw))


def agent_step(
    step_id: str,
    *,
    cwd: str | Path,
    profile: str | None = "acctA",
    provider: str = "codewith",
    depends_on: list[str] | None = None,
    prompt: str | None = None,
    max_per_profile: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    routing: dict[str, Any] = {"role": step_id}
    if max_per_profile is not None:
        routing["maxPerProfile"] = max_per_profile
    return {
        "id": step_id,
        "role": step_id,
        "kind": "agent",
        "dependsOn": depends_on if depends_on is not None else [],
        "target": {
            "type": "agent",
            "provider": provider,
            "authProfile": profile,
            "cwd": str(cwd),
            "prompt": prompt or f"Do the {step_id} part.",
            "sandbox": "workspace-write",
        },
        "routing": routing,
        **extra,
    }


def command_step(
    step_id: str,
    command: str,
    *args: str,
    cwd: str | Path | None = None,
    depends_on: list[str] | None = None,
    shell: bool = False,
    env: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    target: dict[str, Any] = {
        "type": "command",
        "command": command,
        "args": list(args),
        "shell": shell,
    }
    if cwd is not None:
        target["cwd"] = str(cwd)
    if env:
        target["env"] = env
    step: dict[str, Any] = {"id": step_id, "kind": "command", "target": target, **extra}
    if depends_on is not None:
        step["dependsOn"] = depends_on
    return step


def admit_workflow(
    steps: list[dict[str, Any]],
    *,
    route_key: str = "generic-event",
    template_id: str | None = EVENT_WORKER_VERIFIER,
) -> WorkflowRun:
    """Rows exactly as admission leaves them (routing.admission._admit), for any steps.

    Generated route workflows are admitted through `route_event` in the tests; this builds
    hand-written workflows (command steps, DAGs, timeouts) the same way.
    """
    n = next(_seq)
    key = f"{route_key}:runner-test:evt-{n}-{time.time_ns()}"
    invocation = WorkflowInvocation.objects.create(
        template_id=template_id,
        source_kind="event",
        source_id=f"evt-{n}",
        source_dedupe_key=key,
        source_json={"kind": "event", "id": f"evt-{n}", "dedupeKey": key},
        subject_kind="event",
        subject_id=f"evt-{n}",
        subject_json={"kind": "event", "id": f"evt-{n}"},
        intent="route",
    )
    item = WorkflowWorkItem.objects.create(
        route_key=route_key,
        idempotency_key=key,
        invocation=invocation,
        source_type="build.failed",
        source_ref=f"evt-{n}",
        subject_ref=f"evt-{n}",
        route_scope=route_key,
        status=WorkItemStatus.QUEUED,
    )
    spec = WorkflowSpec.objects.create(
        name=f"runner-test:{n}:{time.time_ns()}:workflow", steps_json=steps
    )
    _loop, run = work_item_admit(
        item=item,
        spec=spec,
        invocation=invocation,
        loop_name=f"runner-test:{n}:run",
        loop_description=f"runner test workflow {n}",
        reason=f"admitted by {route_key} route",
        now=timezone.now(),
    )
    return run


def event_types(run: WorkflowRun) -> list[tuple[int, str, str | None]]:
    return list(
        WorkflowEvent.objects.filter(workflow_run=run)
        .order_by("sequence")
        .values_list("sequence", "event_type", "step_id")
    )


def steps_of(run: WorkflowRun) -> dict[str, WorkflowStepRun]:
    return {s.step_id: s for s in WorkflowStepRun.objects.filter(workflow_run=run)}


def cool_account(profile: str, minutes: int = 10) -> None:
    """`profile` reported a rate limit: it cools for `minutes` from now."""
    services.account_cooldown_record(
        profile=profile,
        tool="codewith",
        until=timezone.now() + timedelta(minutes=minutes),
        reason="429",
    )


# --- child processes against the test database -------------------------------------------------


@contextmanager
def admission_lock_held(name: str = "loopsweb 4321 host-x") -> Iterator[None]:
    """The admission lock (PostgreSQL), held by a connection of the test's own, named as a
    loopsweb process (`loopsweb <pid> <host>`), until the block ends."""
    conn = connections.create_connection("default")
    try:
        with conn.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "SELECT set_config('application_name', %s, true);"
                " SELECT pg_advisory_xact_lock(%s, %s)",
                [name, ADVISORY_NAMESPACE, ADMISSION_KEY],
            )
        yield
    finally:
        try:
            conn.close()  # the lock goes with the session
        except DatabaseError:
            pass


def child_database_url() -> str:
    """DATABASE_URL naming the database this test is using (the test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = quote(s.get("USER") or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{s['NAME']}"


def spawn_runner(run_id: str, *, extra_env: dict[str, str]) -> subprocess.Popen[str]:
    """`manage.py run_workflow RUN_ID` in its own session, on the test database."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=child_database_url(),
        **{f"LOOPSWEB_{p.upper()}_BIN": str(FAKE_AGENT) for p in PROVIDERS},
    )
    env.update(extra_env)  # may name another binary for a provider
    return subprocess.Popen(
        [sys.executable, MANAGE_PY, "run_workflow", run_id],
        cwd=scratch_cwd(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def process_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_group_quietly(pid: int | None) -> None:
    if not pid:
        return
    try:
        os.killpg(pid, 9)
    except OSError:
        pass


def iter_lines(text: str) -> Iterator[str]:
    yield from (line for line in text.splitlines() if line.strip())


# --- git projects ------------------------------------------------------------------------------


def git(directory: str | Path, *args: str) -> str:
    """Run git in `directory` (argv, no shell) and return its stdout; fails the test on error."""
    result = subprocess.run(
        [
            "git",
            "-C",
            str(directory),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def git_project(path: Path, *, commit: bool = True) -> Path:
    """A git work tree at `path` with one committed file (or no commit at all)."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    if commit:
        (path / "README").write_text("project\n")
        git(path, "add", "README")
        git(path, "commit", "-q", "-m", "initial")
    return path


def register_accounts(*names: str) -> None:
    """Registered codewith accounts, so a pool of them is routed by loopsweb's pool rules."""
    for name in names:
        services.account_add(name=name, provider="codewith")


def account_moves(run: WorkflowRun) -> list[tuple[str, str, str]]:
    """(from, to, code) of each `step_account_moved` event of `run`, in order."""
    payloads = (
        WorkflowEvent.objects.filter(workflow_run=run, event_type="step_account_moved")
        .order_by("sequence")
        .values_list("payload_json", flat=True)
    )
    # A move without a payload raises KeyError here: every move names its accounts.
    return [(p["from"], p["to"], p["code"]) for p in (q or {} for q in payloads)]


def start_installation(
    tmp_path: Path, port: int, **extra: str
) -> tuple[dict[str, str], Path, subprocess.Popen[bytes]]:
    """`make run` (scripts/run.sh) on the test database, its web server on `port`, the fake
    agent recording into `tmp_path/records`: a second terminal's environment, the log and
    the process (stop it with tests.processes.stop_make_run)."""
    (tmp_path / "records").mkdir()
    env = terminal_env(
        tmp_path / "data",
        DATABASE_URL=child_database_url(),
        LOOPSWEB_PORT=str(port),
        LOOPSWEB_ADMIN_PASSWORD="a-long-test-password",
        FAKE_AGENT_RECORD_DIR=str(tmp_path / "records"),
        **extra,
    )
    log = tmp_path / "make-run.log"
    return env, log, start_make_run(env, log)
