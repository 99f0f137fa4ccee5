"""Windows through the real processes (docs/windows.md): `manage.py ingest_events` and `drain`
as child processes, the run cluster (`qcluster`) running the REAL codex against the provider
stand-in, which reports acct-a's 5-hour window 95 % used and acct-b's 42 %.

The first run's steps (pool acct-a, acct-b) meet both accounts and record their windows from
codex's rollout; the next task's steps (pool acct-a, acct-b, acct-c; acct-c at 45 %) go to
acct-b and acct-c, never acct-a (past --max-window-used; worker ≠ verifier takes the third);
with `--max-window-used 0.4` no account is left and the drain defers the task with
`window_exhausted` until the earliest reset; /ops/accounts/, /metrics and the API show the
windows the stand-in sent.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from domain import reasons
from ledger.models import (
    AccountWindow,
    RunStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import run_env, task_event
from tests.ledger.runner_helpers import git_project
from tests.processes import manage, start_qcluster, stop_process_group, wait_until
from tests.routing.api.helpers import bearer, make_token

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("agent_clis"),
]

KEYS = {
    "acct-a": "key-of-acct-a-0123",
    "acct-b": "key-of-acct-b-4567",
    "acct-c": "key-of-acct-c-89ab",
}
FIRST_POOL = "acct-a,acct-b"
POOL = ",".join(KEYS)


def _ingest(env: dict[str, str], project: Path, tmp_path: Path, n: int) -> None:
    task: dict[str, Any] = task_event(project, "codex")
    task["id"] = f"evt-codex-{n}"
    task["data"] = {**task["data"], "id": f"REAL-codex-{n}"}
    path = tmp_path / f"task-{n}.json"
    path.write_text(json.dumps(task))
    manage(env, "ingest_events", str(path))


def _drain(env: dict[str, str], pool: str, *extra: str) -> dict[str, Any]:
    done = manage(
        env,
        "drain",
        "todos-task",
        "--auth-profile-pool",
        pool,
        "--provider",
        "codex",
        "--max-active",
        "2",
        "--json",
        *extra,
    )
    return json.loads(done.stdout)


def test_a_spent_window_steers_the_next_steps_and_then_defers_the_pool(
    cli_bin: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    stand_in.windows = {
        KEYS["acct-a"]: 0.95,
        KEYS["acct-b"]: 0.42,
        KEYS["acct-c"]: 0.45,
    }
    for name, key in KEYS.items():
        clis.register_account("codex", name, stand_in, tmp_path, key=key)
    project = git_project(tmp_path / "project")
    env = run_env("codex", cli_bin)
    cluster = start_qcluster(env, tmp_path / "runs.log", cluster="loopsweb-runs")

    def ended(n: int) -> list[WorkflowRun]:
        assert cluster.poll() is None, (tmp_path / "runs.log").read_text()[-3000:]
        runs = list(
            WorkflowRun.objects.filter(
                status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT]
            )
        )
        return runs if len(runs) >= n else []

    try:
        _ingest(env, project, tmp_path, 1)
        assert _drain(env, FIRST_POOL)["created"] == 1
        (first,) = wait_until(lambda: ended(1), timeout=240, what="the first run")
        assert first.status == RunStatus.SUCCEEDED, first.error
        steps = WorkflowStepRun.objects.filter(workflow_run=first)
        # Nothing known yet: worker and verifier on the two accounts.
        assert {s.account_profile for s in steps} == set(FIRST_POOL.split(","))
        seen = {
            (w.account_profile, w.window): w.used
            for w in AccountWindow.objects.filter(source="codex rollout")
        }
        assert seen[("acct-a", "5h")] == pytest.approx(0.95)
        assert seen[("acct-b", "5h")] == pytest.approx(0.42)

        _ingest(env, project, tmp_path, 2)
        assert _drain(env, POOL)["created"] == 1
        runs = wait_until(lambda: ended(2), timeout=240, what="the second run")
        (second,) = [r for r in runs if r.id != first.id]
        assert second.status == RunStatus.SUCCEEDED, second.error
        accounts = {
            s.account_profile
            for s in WorkflowStepRun.objects.filter(workflow_run=second)
        }
        assert accounts == {"acct-b", "acct-c"}
        assert not stand_in.model_calls(KEYS["acct-a"])[len(steps) :]  # no new call

        _ingest(env, project, tmp_path, 3)
        report = _drain(env, POOL, "--max-window-used", "0.4")
        assert report["throttled"] == 1, report
        (held,) = report["results"]
    finally:
        stop_process_group(cluster)
    assert held["reasonCode"] == reasons.WINDOW_EXHAUSTED
    assert "acct-a: 5h 95%" in held["reason"] and "acct-b: 5h 42%" in held["reason"]
    assert "acct-c: 5h 45%" in held["reason"]
    reset = stand_in._window_epoch + stand_in.window_reset_seconds
    first = datetime.fromtimestamp(reset, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert held["reason"].endswith(f"until {first}")  # the earliest reset
    assert not WorkflowWorkItem.objects.filter(
        idempotency_key="todos-task:REAL-codex-3", workflow_run__isnull=False
    ).exists()

    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    page = client.get("/ops/accounts/").content.decode()
    assert page.count('class="window-row"') == 6 and "codex rollout" in page
    _, token = make_token("metrics", "read")
    text = client.get("/metrics", **bearer(token)).content.decode()
    assert (
        'loopsweb_account_window_used_ratio{account="acct-a",window="5h"} 0.95' in text
    )
    api = client.get("/api/v1/accounts", **bearer(token)).json()["accounts"]
    marks = {a["profile"]: a["windowMark"] for a in api}
    assert marks == {"acct-a": "at window", "acct-b": None, "acct-c": None}
