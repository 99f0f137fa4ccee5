"""A bad login stops getting work (issue 39), with the REAL codex and claude against the
provider stand-in, which answers 401 to one account's key (opencode's 401 marking its account
is in tests/agents/test_runner_real.py; this file is about the ledger: `clis.through_the_ledger`):

- through the run cluster (`manage.py qcluster`) and `manage.py drain` processes: the step
  on that account fails with the CLI's own words and marks the account `login failed`; the
  next drain assigns it nothing (no second request carries its key) and, with the other
  member disabled, defers with `account NAME: login failed`;
- `manage.py account check` makes a real request: it fails for the rejected key (and marks
  the account), then, once the stand-in takes the key, succeeds and clears the mark.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.models import (
    Account,
    RunStatus,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
)
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import KEYS, run_env
from tests.ledger.runner_helpers import git_project
from tests.processes import manage, start_qcluster, stop_process_group, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group(
        "agent_clis_login"
    ),  # minutes of its own: beside agent_clis
]

PROVIDERS = clis.through_the_ledger(*clis.REAL_CLIS)
BAD = "acct-a"  # the stand-in answers 401 to its key
THIRD, THIRD_KEY = "acct-c", "key-of-acct-c-89ab"


def _task(tmp_path: Path, project: Path, n: int) -> Path:
    path = tmp_path / f"task-{n}.json"
    path.write_text(
        json.dumps(
            {
                "id": f"evt-login-{n}",
                "type": "task.created",
                "source": "@hasna/todos",
                "data": {
                    "id": f"LOGIN-{n}",
                    "title": "Write agent-output.txt",
                    "description": "Write the file agent-output.txt.",
                    "tags": ["auto:route"],
                    "project_path": str(project),
                },
            }
        )
    )
    return path


def _posts(stand_in: ProviderStandIn, key: str) -> int:
    return len([r for r in stand_in.requests if r.method == "POST" and r.key == key])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_401_account_gets_no_second_step(
    provider: str, cli_bin: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    stand_in.modes[KEYS[BAD]] = "401"
    # A third account: once acct-a's login failed, a run needs two others (worker !=
    # verifier).
    for name, key in {**KEYS, THIRD: THIRD_KEY}.items():
        clis.register_account(provider, name, stand_in, tmp_path, key=key)
    project = git_project(tmp_path / "project")
    env = run_env(provider, cli_bin)
    log = tmp_path / "runs.log"
    cluster = start_qcluster(env, log, cluster="loopsweb-runs")

    def drain(n: int, pool: str = "acct-a,acct-b") -> str:
        manage(env, "ingest_events", str(_task(tmp_path, project, n)))
        # No --provider: the pool's accounts are all `provider`'s.
        return manage(
            env, "drain", "todos-task", "--auth-profile-pool", pool, "--json"
        ).stdout

    def ended(n: int) -> WorkflowRun:
        def done() -> WorkflowRun | None:
            assert cluster.poll() is None, log.read_text()[-3000:]
            return WorkflowRun.objects.filter(
                work_item__subject_ref=f"LOGIN-{n}",
                status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT],
            ).first()

        return wait_until(done, timeout=240, what=f"run {n} to end")

    try:
        # A pool of two: the step that met the 401 has no account to move to (the other
        # one is the other role's), so this run fails.
        assert '"created": 1' in drain(1)
        first = ended(1)
        assert first.status == RunStatus.FAILED, first.error
        account = Account.objects.get(pk=BAD)
        assert account.login_failed_at is not None, first.error
        # The attempt on acct-a (the step may have been moved off it since).
        failed = WorkflowStepAttempt.objects.get(
            workflow_run=first, account_profile=BAD
        )
        assert failed.status == "login_failed", failed.status
        # The agent's own words, as the attempt recorded them.
        assert account.login_failed_reason == failed.error
        assert KEYS[BAD] not in (account.login_failed_reason or "")
        posts = _posts(stand_in, KEYS[BAD])
        assert posts >= 1

        assert '"created": 1' in drain(2, f"acct-a,acct-b,{THIRD}")
        second = ended(2)
        assert second.status == RunStatus.SUCCEEDED, second.error
        assert set(
            WorkflowStepRun.objects.filter(workflow_run=second).values_list(
                "account_profile", flat=True
            )
        ) == {"acct-b", THIRD}
        assert _posts(stand_in, KEYS[BAD]) == posts  # no second request on its key
        # One attempt ever on acct-a: the one that met the 401.
        assert WorkflowStepAttempt.objects.filter(account_profile=BAD).count() == 1

        # No other member: the drain defers, naming the account.
        manage(env, "account", "disable", "acct-b")
        held = drain(3)
        assert '"created": 0' in held and f"account {BAD}: login failed" in held, held
    finally:
        stop_process_group(cluster)
    listing = manage(env, "account", "list").stdout
    line = next(x for x in listing.splitlines() if x.startswith(BAD))
    assert "LOGIN FAILED" in line


@pytest.mark.parametrize("provider", PROVIDERS)
def test_account_check_makes_a_real_request_and_clears_the_mark(
    provider: str, cli_bin: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    stand_in.modes[KEYS[BAD]] = "401"
    clis.register_account(provider, BAD, stand_in, tmp_path, key=KEYS[BAD])
    env = run_env(provider, cli_bin)

    refused = manage(env, "account", "check", BAD, check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1, said
    assert "the provider refused the login" in said and "marked login failed" in said
    assert KEYS[BAD] not in said
    assert _posts(stand_in, KEYS[BAD]) >= 1  # a real request, not only --version
    assert Account.objects.get(pk=BAD).login_failed_at is not None

    del stand_in.modes[KEYS[BAD]]  # the key works again
    answered = manage(env, "account", "check", BAD)
    assert "a real request was answered" in answered.stdout
    assert "cleared the login failed mark" in answered.stdout
    account = Account.objects.get(pk=BAD)
    assert account.login_failed_at is None and account.login_failed_reason is None
