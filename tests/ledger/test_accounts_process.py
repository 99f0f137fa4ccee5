"""Registered accounts through the processes operators run: `manage.py account add`,
`ingest_events`, `drain` and `run_workflow` as child processes, with a recording stand-in
for the codex and claude binaries (tests/ledger/standins/agent-standin) that writes down the
login directory it was given. Committed rows (`transaction=True`), so the children see them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ledger.models import (
    AccountCooldown,
    RunStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
)
from tests.ledger.runner_helpers import ROOT, VENV_BIN, child_database_url, git_project
from tests.processes import manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STANDIN = Path(__file__).resolve().parent / "standins" / "agent-standin"
FIXTURES = ROOT / "tests" / "fixtures" / "usage"
HOME_VAR = {"codex": "CODEX_HOME", "claude": "CLAUDE_CONFIG_DIR"}
USAGE = {"codex": (24763, 122, None), "claude": (18 + 5120 + 13402, 311, 0.0421875)}


def _env(tmp_path: Path) -> dict[str, str]:
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STANDIN_", "FAKE_AGENT_")) and not k.endswith("_BIN")
    }
    env.update(
        DATABASE_URL=child_database_url(),
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        LOOPSWEB_CODEX_BIN=str(STANDIN),
        LOOPSWEB_CLAUDE_BIN=str(STANDIN),
        LOOPSWEB_STEP_START_POLL_SECONDS="1",
        LOOPSWEB_KILL_GRACE_SECONDS="0",
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*,STANDIN_*",
        STANDIN_RECORD_DIR=str(records),
        STANDIN_FIXTURES=str(FIXTURES),
    )
    return env


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(p.read_text()) for p in sorted((tmp_path / "records").glob("*.json"))
    ]


def _setup(
    tmp_path: Path,
    provider: str,
    events: int,
    names: tuple[str, ...] = ("acctA", "acctB"),
) -> tuple[dict[str, str], dict[str, Path]]:
    env = _env(tmp_path)
    homes = {name: tmp_path / "logins" / name for name in names}
    for name, home in homes.items():
        home.mkdir(parents=True)
        manage(
            env,
            "account",
            "add",
            name,
            "--provider",
            provider,
            "--env",
            f"{HOME_VAR[provider]}={home}",
        )
    # A git work tree: claude runs only in the run's own worktree (isolation).
    project = git_project(tmp_path / "project")
    lines = [
        json.dumps(
            {
                "id": f"evt-{provider}-{n}",
                "type": "build.failed",
                "source": "ci",
                "data": {
                    "project_path": str(project),
                    "title": f"Fix {n}",
                    "message": "x",
                },
            }
        )
        for n in range(events)
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    manage(env, "ingest_events", str(tmp_path / "events.jsonl"))
    return env, homes


# Which login directory each provider's step gets is no database matter: claude's row runs in
# the SQLite suite only (as the real CLIs' rows do, tests/agents/clis.on_each_cli).
@pytest.mark.parametrize(
    "provider", ["codex", pytest.param("claude", marks=pytest.mark.sqlite)]
)
def test_drains_over_a_registered_pool_run_each_step_with_its_accounts_login(
    tmp_path: Path, provider: str, admin_client: Any
) -> None:
    env, homes = _setup(tmp_path, provider, events=4)
    drained = manage(
        env,
        "drain",
        "generic",
        "--provider",
        provider,
        "--auth-profile-pool",
        "acctA,acctB",
        "--max-dispatch",
        "4",
        "--json",
        timeout=180,
    )
    assert json.loads(drained.stdout)["created"] == 4, drained.stdout
    runs = list(WorkflowRun.objects.order_by("pk"))
    assert len(runs) == 4
    for run in runs:
        manage(env, "run_workflow", run.id, timeout=180)

    records = _records(tmp_path)
    assert len(records) == 8  # worker + verifier of four runs, each a real process
    steps = {(s.workflow_run_id, s.step_id): s for s in WorkflowStepRun.objects.all()}
    used = set()
    for record in records:
        assert record["cli"] == provider
        account = record["account"]
        # The login the CLI was handed is the recorded account's, every time.
        assert record["home"] == str(homes[account])
        assert steps[(record["run"], record["step"])].account_profile == account
        used.add(account)
        assert record["argv"][-2] == "--"
    assert used == {"acctA", "acctB"}  # least-loaded routing spread the pool
    inp, out, cost = USAGE[provider]
    for step in steps.values():
        assert step.status == "succeeded"
        assert (step.usage_input_tokens, step.usage_output_tokens) == (inp, out)
        assert step.usage_cost_usd == cost
    assert {r.status for r in WorkflowRun.objects.all()} == {RunStatus.SUCCEEDED}

    page = admin_client.get("/ops/accounts/").content.decode()
    for account in ("acctA", "acctB"):
        n = sum(1 for s in steps.values() if s.account_profile == account)
        assert f"{n * inp} in / {n * out} out" in page
    assert f"{HOME_VAR[provider]}={homes['acctA']}" in page


def test_a_rate_limited_step_runs_again_on_the_other_account(
    tmp_path: Path,
) -> None:
    # Three accounts: after the worker's move the verifier keeps one that is neither the
    # worker's nor cooling (worker != verifier; with two it would wait for the cooldown).
    env, homes = _setup(tmp_path, "codex", events=1, names=("acctA", "acctB", "acctC"))
    manage(
        env,
        "drain",
        "generic",
        "--provider",
        "codex",
        "--auth-profile-pool",
        "acctA,acctB,acctC",
        "--json",
        timeout=180,
    )
    run = WorkflowRun.objects.get()
    limited = WorkflowStepRun.objects.get(
        workflow_run=run, step_id="worker"
    ).account_profile
    (homes[limited] / "rate-limited").write_text("")

    manage(env, "run_workflow", run.id, timeout=180)

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    other = WorkflowStepRun.objects.get(
        workflow_run=run, step_id="worker"
    ).account_profile
    verifier = WorkflowStepRun.objects.get(workflow_run=run, step_id="verifier")
    assert other not in (limited, None) and verifier.account_profile != other
    worker = [r for r in _records(tmp_path) if r["step"] == "worker"]
    assert [r["home"] for r in worker] == [str(homes[limited]), str(homes[other])]
    assert (
        WorkflowStepRun.objects.get(workflow_run=run, step_id="worker").account_profile
        == other
    )
    assert AccountCooldown.objects.filter(pk=limited).exists()
    moved = WorkflowEvent.objects.get(workflow_run=run, event_type="step_account_moved")
    assert moved.payload_json["code"] == "rate_limit"
    assert (moved.payload_json["from"], moved.payload_json["to"]) == (limited, other)
