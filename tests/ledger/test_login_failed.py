"""A bad login stops getting work (issue 39): the recognition of an authentication error in a
failed step's output (agents.ratelimit.detect_login_failure), the `login failed` mark a
step's refused login sets on its account (the runner, in-process with the fake agent),
pool assignment and failover skipping it, the deferral when no other member is left,
`account enable` clearing it, and `account list` and /ops/accounts/ showing it.

The real CLIs against the provider stand-in, through the run cluster, and `account check`'s
real request: tests/agents/test_login_failed_real.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from agents.ratelimit import detect_login_failure
from domain import reasons
from domain.pool import assign_pool_auth_profiles
from ledger import services
from ledger.models import (
    Account,
    RunStatus,
    WorkflowEvent,
    WorkflowStepAttempt,
)
from routing.admission import THROTTLED
from runs.runner import run_workflow_run
from tests.ledger.account_failover_helpers import pooled_run
from tests.ledger.runner_helpers import (
    FakeAgent,
    git_project,
    register_accounts,
    route_generic,
    steps_of,
)

# What the real CLIs print on a refused login (docs/agents.md, measured).
CODEX_401 = (
    '{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized: '
    'Incorrect API key provided., url: http://127.0.0.1:9/v1/responses"}}'
)
CLAUDE_NO_LOGIN = (
    '{"type":"result","subtype":"success","is_error":true,'
    '"result":"Not logged in \u00b7 Please run /login"}'
)
CLAUDE_401 = (
    '{"type":"result","is_error":true,"api_error_status":401,"result":"API Error"}'
)
OPENCODE_401 = (
    '{"type":"error","error":{"name":"APIError","data":{"message":'
    '"Incorrect API key provided.","statusCode":401}}}'
)


@pytest.mark.parametrize(
    "output", [CODEX_401, CLAUDE_NO_LOGIN, CLAUDE_401, OPENCODE_401, "Invalid API key"]
)
def test_each_clis_refused_login_is_recognised(output: str) -> None:
    signal = detect_login_failure(output=f"start\n{output}\nend", exit_code=1)
    assert signal is not None and signal.snippet == output


@pytest.mark.parametrize(
    ("output", "exit_code"),
    [
        (CODEX_401, 0),  # a step that succeeded printed the words (it edited auth code)
        ("last status: 429 Too Many Requests", 1),
        ("wrote tests/fixtures/401.html", 1),
        ("the build failed: 3 tests", 1),
    ],
)
def test_other_output_is_no_login_failure(output: str, exit_code: int) -> None:
    assert detect_login_failure(output=output, exit_code=exit_code) is None


def test_pool_assignment_skips_a_failed_login_and_defers_naming_it() -> None:
    chosen = assign_pool_auth_profiles(
        ["a", "b", "c"], {}, "seed", ["worker", "verifier"], login_failed=["a"]
    )
    assert set(chosen.profiles.values()) == {"b", "c"} and not chosen.deferred
    # Worker ≠ verifier: with b the only member left, a verifier has none (domain.pool 8).
    alone = assign_pool_auth_profiles(
        ["a", "b"], {}, "seed", ["worker", "verifier"], login_failed=["a"]
    )
    assert alone.deferred and alone.reason_code == reasons.LOGIN_FAILED
    assert alone.reason is not None and "account a: login failed" in alone.reason
    # b disabled: no other member left, the deferral names the account.
    held = assign_pool_auth_profiles(
        ["a", "b"], {}, "seed", ["worker"], disabled=["b"], login_failed=["a"]
    )
    assert held.deferred and held.reason_code == reasons.LOGIN_FAILED
    assert held.reason == "account a: login failed"
    both = assign_pool_auth_profiles(
        ["a", "b"], {}, "seed", ["worker"], login_failed=["a", "b"]
    )
    assert both.reason == "account a: login failed; account b: login failed"


@pytest.mark.slow
@pytest.mark.django_db
def test_a_refused_login_marks_the_account_and_no_later_step_is_assigned_to_it(
    agent: FakeAgent, tmp_path: Path
) -> None:
    register_accounts("acctA", "acctB")
    agent.configure(
        profiles={
            "acctA": {"stderr": "unexpected status 401 Unauthorized", "exit": 1},
        }
    )
    project = git_project(tmp_path / "project")
    # A step on acctA (issue 58: the refused login moves it to acctB, the run succeeds).
    first = pooled_run(project, ["acctA", "acctB"])
    assert run_workflow_run(first.id) == RunStatus.SUCCEEDED
    failed = WorkflowStepAttempt.objects.get(
        workflow_run=first, account_profile="acctA", status="login_failed"
    )
    account = Account.objects.get(pk="acctA")
    assert account.login_failed_at is not None
    assert account.login_failed_at >= failed.started_at
    assert "401 Unauthorized" in (account.login_failed_reason or "")
    assert failed.error == account.login_failed_reason
    assert Account.objects.get(pk="acctB").login_failed_at is None

    # Every later admission leaves acctA out; its runs succeed on acctB and acctC (worker ≠
    # verifier: a run of two roles needs two accounts).
    register_accounts("acctC")
    for _ in range(3):
        run = route_generic(
            project, auth_profile_pool="acctA,acctB,acctC", created=True
        ).run
        assert {s.account_profile for s in steps_of(run).values()} == {"acctB", "acctC"}
        assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert [r["profile"] for r in agent.records()].count("acctA") == 1

    # No other member left: the pool defers, naming the account.
    services.account_set_enabled(name="acctB", enabled=False)
    services.account_set_enabled(name="acctC", enabled=False)
    held = route_generic(project, auth_profile_pool="acctA,acctB,acctC")
    assert held.kind == THROTTLED
    assert held.reason_code == reasons.LOGIN_FAILED
    assert held.reason == "account acctA: login failed"


@pytest.mark.slow
@pytest.mark.django_db
def test_a_step_admitted_before_the_mark_moves_to_a_free_member(
    agent: FakeAgent, tmp_path: Path
) -> None:
    register_accounts("acctA", "acctB", "acctC")
    project = git_project(tmp_path / "project")
    run = route_generic(
        project, auth_profile_pool="acctA,acctB,acctC", created=True
    ).run
    worker = steps_of(run)["worker"].account_profile
    assert worker is not None
    assert services.account_login_failed_record(profile=worker, reason="Not logged in")
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert steps_of(run)["worker"].account_profile != worker
    moved = WorkflowEvent.objects.get(workflow_run=run, event_type="step_account_moved")
    assert moved.payload_json["code"] == reasons.LOGIN_FAILED
    assert moved.payload_json["reason"] == f"account {worker}: login failed"


@pytest.mark.django_db
def test_account_list_and_the_accounts_page_show_the_mark_and_enable_clears_it(
    admin_client,
) -> None:
    register_accounts("acctA", "acctB")
    assert services.account_login_failed_record(
        profile="acctA", reason="Invalid API key · Fix external API key (exit code 1)"
    )
    assert not services.account_login_failed_record(profile="nobody", reason="x")
    out = io.StringIO()
    call_command("account", "list", stdout=out)
    line = next(x for x in out.getvalue().splitlines() if x.startswith("acctA"))
    assert "LOGIN FAILED at 20" in line and "Invalid API key" in line
    out = io.StringIO()
    call_command("account", "list", "--json", stdout=out)
    entries = {e["name"]: e for e in json.loads(out.getvalue())}
    assert entries["acctA"]["loginFailedReason"].startswith("Invalid API key")
    assert entries["acctB"]["loginFailedAt"] is None
    page = admin_client.get("/ops/accounts/").content.decode()
    assert "login-failed" in page and "Invalid API key" in page
    accounts = admin_client.get("/api/v1/accounts").json()["accounts"]
    registry = {a["profile"]: a["registry"] for a in accounts}
    assert registry["acctA"]["loginFailedReason"].startswith("Invalid API key")
    assert (
        registry["acctA"]["loginFailedAt"]
        and registry["acctB"]["loginFailedAt"] is None
    )
    change = admin_client.get("/admin/ledger/account/acctA/change/").content.decode()
    assert "Invalid API key" in change

    # Already enabled, the mark is still something to clear.
    out = io.StringIO()
    call_command("account", "enable", "acctA", stdout=out)
    assert out.getvalue().strip() == "account: enabled acctA"
    assert Account.objects.get(pk="acctA").login_failed_at is None
    out = io.StringIO()
    call_command("account", "enable", "acctA", stdout=out)
    assert out.getvalue().strip() == "account: already enabled acctA"
    assert "login-failed" not in admin_client.get("/ops/accounts/").content.decode()


@pytest.mark.django_db
def test_the_admins_enable_action_clears_the_mark_as_account_enable_does(
    admin_client,
) -> None:
    register_accounts("acctA", "acctB")
    services.account_login_failed_record(profile="acctA", reason="Not logged in")
    response = admin_client.post(
        "/admin/ledger/account/",
        {"action": "enable_accounts", "_selected_action": ["acctA", "acctB"]},
        follow=True,
    )
    assert "1 account(s) enabled" in response.content.decode()
    assert Account.objects.get(pk="acctA").login_failed_at is None


@pytest.mark.slow  # git makes the project
@pytest.mark.django_db
def test_a_route_pinned_to_an_account_that_cannot_start_is_deferred_naming_it(
    tmp_path: Path,
) -> None:
    """Never admit what cannot start: a route pinned (`--auth-profile`) to an account whose
    login failed, or that is disabled, is deferred with the reason, not admitted to wait."""
    register_accounts("acctA")
    project = git_project(tmp_path / "project")
    services.account_login_failed_record(profile="acctA", reason="Not logged in")
    held = route_generic(project, auth_profile="acctA")
    assert held.kind == THROTTLED
    assert held.reason_code == reasons.LOGIN_FAILED
    assert held.reason == "account acctA: login failed"
    services.account_set_enabled(name="acctA", enabled=False)
    held = route_generic(project, auth_profile="acctA")
    assert held.reason_code == reasons.ACCOUNT_DISABLED
    assert held.reason == "account acctA: disabled in the account registry"
    # Enabled again (which clears the mark): admitted.
    services.account_set_enabled(name="acctA", enabled=True)
    assert route_generic(project, auth_profile="acctA").kind == "created"
