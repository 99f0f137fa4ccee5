"""A hang moves the step, through the runner as operators run it (issue 58, item 7):
`manage.py run_workflow` as a child process with the fake agent, against the test database,
a pool of two whose first member hangs: the run succeeds on the other, the hung account is
marked `unresponsive`, and each try is an attempt row. The in-process tests of every path:
tests/ledger/test_account_failover.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from domain import reasons
from ledger import services
from ledger.models import Account, RunStatus, WorkflowEvent, WorkflowRun
from tests.ledger.account_failover_helpers import attempts_of, pooled_run
from tests.ledger.runner_helpers import (
    VENV_BIN,
    git_project,
    kill_group_quietly,
    spawn_runner,
    steps_of,
)
from tests.waiting import HANG_SECONDS, hang_deadline

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_pool_of_two_with_a_hanging_member_succeeds_on_the_other(
    tmp_path: Path,
) -> None:
    for name in ("acctA", "acctB"):
        services.account_add(name=name, provider="codewith")
    config = tmp_path / "agent.json"
    # acctA prints its argv, then nothing until a hang deadline.
    config.write_text(
        json.dumps({"profiles": {"acctA": {"sleep": round(hang_deadline(120))}}})
    )
    records = tmp_path / "agent-records"
    records.mkdir()
    run = pooled_run(
        git_project(tmp_path / "project"), ["acctA", "acctB"], idle_ms=1000
    )
    child = spawn_runner(
        run.id,
        extra_env={
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FAKE_AGENT_CONFIG": str(config),
            "FAKE_AGENT_RECORD_DIR": str(records),
            "LOOPSWEB_KILL_GRACE_SECONDS": "0",
            "LOOPSWEB_STEP_START_POLL_SECONDS": "1",
        },
    )
    try:
        out, err = child.communicate(timeout=hang_deadline(HANG_SECONDS))
    finally:
        kill_group_quietly(child.pid if child.poll() is None else None)
    assert child.returncode == 0, err

    run = WorkflowRun.objects.get(pk=run.id)
    assert run.status == RunStatus.SUCCEEDED, (run.error, err)
    assert steps_of(run)["worker"].account_profile == "acctB"
    assert attempts_of(run) == [("acctA", "unresponsive"), ("acctB", "succeeded")]
    moved = WorkflowEvent.objects.get(workflow_run=run, event_type="step_account_moved")
    assert moved.payload_json["code"] == reasons.UNRESPONSIVE
    assert Account.objects.get(pk="acctA").unresponsive_until is not None
    assert Account.objects.get(pk="acctB").unresponsive_until is None
    profiles = [json.loads(p.read_text())["profile"] for p in sorted(records.iterdir())]
    assert sorted(profiles) == ["acctA", "acctB"]
