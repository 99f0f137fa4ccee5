"""An account's failure moves the step, never fails the task (issue 58, items 6-7), with the
fake agent in this process: a refused login and a hang (no progress for the idle limit)
move the step to another member of its run's pool as a rate limit does (an attempt row
each, a `step_account_moved` event with its code); a hang marks the account `unresponsive`
for LOOPSWEB_UNRESPONSIVE_SECONDS, which admission, `account list`, /ops/accounts/ and
`account clear` know; only when no account is left does the run fail, with the reason; a
retry leaves out the accounts that failed the item.

The run as a `manage.py run_workflow` process: tests/ledger/test_account_failover_process.py;
the real CLIs: tests/agents/test_account_failover_real.py."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from domain import reasons
from ledger import services
from ledger.models import (
    Account,
    RunStatus,
    StepReasonCode,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowWorkItem,
)
from ledger.selectors import account_registry
from routing.admission import THROTTLED, retry_work_item
from routing.admission.plan import RoutePlan, plan_reads, plan_stored_route
from routing.admission.retry import without_failed_accounts
from routing.ops.account_groups import account_state
from routing.selectors import AccountRow
from runs.runner import NO_ACCOUNT_LEFT, run_workflow_run
from tests.ledger.account_failover_helpers import attempts_of, pooled_run
from tests.ledger.runner_helpers import (
    FakeAgent,
    account_moves,
    git_project,
    register_accounts,
    route_generic,
    steps_of,
)
from tests.waiting import hang_deadline

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

REFUSED = {"stderr": "unexpected status 401 Unauthorized", "exit": 1}


def _hangs() -> dict[str, Any]:
    """A fake agent that prints its argv, then nothing until a hang deadline."""
    return {"sleep": round(hang_deadline(120))}


def test_a_refused_login_moves_the_step_to_the_pools_other_account(
    agent: FakeAgent, tmp_path: Path
) -> None:
    register_accounts("acctA", "acctB")
    agent.configure(profiles={"acctA": REFUSED})
    run = pooled_run(git_project(tmp_path / "project"), ["acctA", "acctB"])

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert steps_of(run)["worker"].account_profile == "acctB"
    assert attempts_of(run) == [("acctA", "login_failed"), ("acctB", "succeeded")]
    assert account_moves(run) == [("acctA", "acctB", reasons.LOGIN_FAILED)]
    assert Account.objects.get(pk="acctA").login_failed_at is not None
    assert [r["profile"] for r in agent.records()] == ["acctA", "acctB"]


def test_a_hang_moves_the_step_and_marks_the_account_unresponsive(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_UNRESPONSIVE_SECONDS = 900
    register_accounts("acctA", "acctB")
    agent.configure(profiles={"acctA": _hangs()})
    project = git_project(tmp_path / "project")
    run = pooled_run(project, ["acctA", "acctB"], idle_ms=1000)
    before = timezone.now()

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert steps_of(run)["worker"].account_profile == "acctB"
    assert attempts_of(run) == [("acctA", "unresponsive"), ("acctB", "succeeded")]
    assert account_moves(run) == [("acctA", "acctB", reasons.UNRESPONSIVE)]
    hung = WorkflowStepAttempt.objects.get(workflow_run=run, account_profile="acctA")
    assert (hung.error or "").startswith("no progress for 1.0 s (idle limit)")
    account = Account.objects.get(pk="acctA")
    assert account.unresponsive_until is not None
    span = timedelta(seconds=900)
    assert before + span <= account.unresponsive_until <= timezone.now() + span
    assert "(idle limit)" in (account.unresponsive_reason or "")
    assert Account.objects.get(pk="acctB").unresponsive_until is None

    # Skipped while it lasts: admission defers a pool whose only other member is
    # disabled, naming it; `account list` and /ops/accounts/ show it.
    services.account_set_enabled(name="acctB", enabled=False)
    held = route_generic(project, auth_profile_pool="acctA,acctB")
    assert held.kind == THROTTLED
    assert held.reason_code == reasons.UNRESPONSIVE
    assert held.reason == "account acctA: unresponsive (a step hung on it)"
    listed = io.StringIO()
    call_command("account", "list", stdout=listed)
    assert "UNRESPONSIVE until " in listed.getvalue()
    row = AccountRow(profile="acctA", registered=account_registry(["acctA"])["acctA"])
    assert account_state(row, timezone.now()) == "unresponsive"

    # `account clear` ends it (with the cooldown); the pool assigns it again.
    cleared = services.account_clear(name="acctA")
    assert cleared.unresponsive_until == account.unresponsive_until
    assert "the unresponsive mark until" in cleared.text()
    assert Account.objects.get(pk="acctA").unresponsive_until is None
    services.account_set_enabled(name="acctB", enabled=True)
    again = route_generic(project, auth_profile_pool="acctA,acctB", created=True).run
    assert {s.account_profile for s in steps_of(again).values()} == {"acctA", "acctB"}


def test_no_account_left_fails_the_run_with_the_reason(
    agent: FakeAgent, tmp_path: Path
) -> None:
    register_accounts("acctA", "acctB")
    agent.configure(profiles={"acctA": _hangs(), "acctB": REFUSED})
    run = pooled_run(
        git_project(tmp_path / "project"), ["acctA", "acctB"], idle_ms=1000
    )

    assert run_workflow_run(run.id) == RunStatus.FAILED
    assert attempts_of(run) == [("acctA", "unresponsive"), ("acctB", "login_failed")]
    assert account_moves(run) == [("acctA", "acctB", reasons.UNRESPONSIVE)]
    run.refresh_from_db()
    assert "401 Unauthorized" in run.error and run.error.endswith(NO_ACCOUNT_LEFT)
    assert steps_of(run)["worker"].reason_code == StepReasonCode.LOGIN_FAILED
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert (item.last_reason or "").endswith(NO_ACCOUNT_LEFT)


def test_a_hang_on_the_last_account_left_times_the_run_out_with_the_reason(
    agent: FakeAgent, tmp_path: Path
) -> None:
    register_accounts("acctA", "acctB")
    agent.configure(profiles={"acctA": _hangs()})
    run = pooled_run(
        git_project(tmp_path / "project"), ["acctA", "acctB"], idle_ms=1000
    )
    services.account_set_enabled(name="acctB", enabled=False)

    assert run_workflow_run(run.id) == RunStatus.TIMED_OUT
    run.refresh_from_db()
    assert "(idle limit)" in run.error and run.error.endswith(NO_ACCOUNT_LEFT)
    assert attempts_of(run) == [("acctA", "unresponsive")]
    assert account_moves(run) == []


def test_a_retry_leaves_out_the_accounts_that_failed_the_item(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_RATE_LIMIT_MOVES = 0  # the first failure ends the run
    settings.LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS = 1
    register_accounts("acctA", "acctB", "acctC")
    agent.configure(steps={"worker": _hangs()})
    project = git_project(tmp_path / "project")
    first = route_generic(
        project, auth_profile_pool="acctA,acctB,acctC", created=True
    ).run
    hung = steps_of(first)["worker"].account_profile
    assert hung is not None
    assert run_workflow_run(first.id) == RunStatus.TIMED_OUT
    assert attempts_of(first) == [(hung, "unresponsive")]
    # The mark is gone: only the item's own history leaves the account out.
    services.account_clear(name=hung)
    agent.configure()

    item = retry_work_item(item_id=first.work_item_id)
    assert item.status == "admitted" and item.workflow_run_id != first.id
    again = WorkflowRun.objects.get(pk=item.workflow_run_id)
    left = {"acctA", "acctB", "acctC"} - {hung}
    assert {s.account_profile for s in steps_of(again).values()} <= left
    routing = again.invocation.scope_json["providerRouting"]
    assert set(routing["pool"]) == left and routing["poolRouting"] is True
    assert run_workflow_run(again.id) == RunStatus.SUCCEEDED

    # When every member failed the item, the retry keeps the whole pool.
    plan = plan_stored_route(item.route_options_json, reads=plan_reads())
    assert isinstance(plan, RoutePlan)
    assert without_failed_accounts(plan, {"acctA", "acctB", "acctC"}) is plan
