"""Failover between pool accounts (ledger.services.failover), in-process with the fake agent:
a step whose account cools after admission moves without waiting, a rate-limited step
succeeds on another member, pinned profiles never move, and with every member cooling the
step waits with its reason on /ops/."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from ledger import services
from ledger.models import (
    Account,
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
)
from ledger.services.account_loads import account_load_drift
from routing.admission import route_event, route_options
from runs.runner import HANDED_BACK, run_workflow_run
from tests.ledger.runner_helpers import (
    FakeAgent,
    git_project,
    route_generic,
    steps_of,
)
from tests.ledger.runner_helpers import (
    cool_account as _cool,
)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _moves(run: WorkflowRun) -> list[dict[str, Any]]:
    return [
        {**(e.payload_json or {}), "step": e.step_id}
        for e in WorkflowEvent.objects.filter(
            workflow_run=run, event_type="step_account_moved"
        ).order_by("sequence")
    ]


def test_a_step_whose_account_cools_after_admission_moves_to_a_free_member_without_waiting(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = route_generic(
        tmp_path, "evt-failover-0", auth_profile_pool="acctA,acctB,acctC", created=True
    ).run
    steps = steps_of(run)
    worker, verifier = (
        steps["worker"].account_profile,
        steps["verifier"].account_profile,
    )
    _cool(worker)

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    free = ({"acctA", "acctB", "acctC"} - {worker, verifier}).pop()
    steps = steps_of(run)
    # The member the verifier does not use: verifier != worker where possible.
    assert steps["worker"].account_profile == free
    assert steps["verifier"].account_profile == verifier
    assert _moves(run) == [
        {
            "step": "worker",
            "from": worker,
            "to": free,
            "code": "cooldown",
            "reason": _moves(run)[0]["reason"],
        }
    ]
    assert "cooling down" in _moves(run)[0]["reason"]
    assert not WorkflowEvent.objects.filter(
        workflow_run=run, event_type="step_waiting"
    ).exists()
    # The agent ran on the account the ledger records.
    ran = {r["step"]: r["profile"] for r in agent.records()}
    assert ran == {"worker": free, "verifier": verifier}
    assert account_load_drift() == []  # the kept loads followed the move


def test_a_disabled_account_is_left_for_a_free_member(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = route_generic(
        tmp_path, "evt-failover-0", auth_profile_pool="acctA,acctB,acctC", created=True
    ).run
    worker = steps_of(run)["worker"].account_profile
    verifier = steps_of(run)["verifier"].account_profile
    Account.objects.create(name=worker, provider="codewith", enabled=False)

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert steps_of(run)["worker"].account_profile not in (worker, verifier)
    assert _moves(run)[0]["code"] == "account_disabled"


def test_a_rate_limited_step_succeeds_on_the_second_account(
    agent: FakeAgent, tmp_path: Path
) -> None:
    # Three members: the worker moves to the one the verifier does not use (with two, the
    # verifier would wait for the first to cool off: tests/ledger/test_worker_verifier.py).
    run = route_generic(
        tmp_path, "evt-failover-0", auth_profile_pool="acctA,acctB,acctC", created=True
    ).run
    first = steps_of(run)["worker"].account_profile
    other = (
        {"acctA", "acctB", "acctC"} - {first, steps_of(run)["verifier"].account_profile}
    ).pop()
    agent.configure(profiles={first: {"rate_limit": "HTTP 429 Too Many Requests"}})

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    assert steps_of(run)["worker"].account_profile == other
    assert AccountCooldown.objects.filter(pk=first, until__gt=timezone.now()).exists()
    (move,) = _moves(run)
    assert (move["from"], move["to"], move["code"]) == (first, other, "rate_limit")
    assert [r["profile"] for r in agent.records() if r["step"] == "worker"] == [
        first,
        other,
    ]
    assert account_load_drift() == []


def test_every_account_rate_limited_holds_the_task_at_its_second_account(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_RATE_LIMIT_MOVES = 2
    pool = ["acctA", "acctB", "acctC", "acctD"]
    agent.configure(default={"rate_limit": "usage limit reached"})
    run = route_generic(
        tmp_path, "evt-failover-0", auth_profile_pool=",".join(pool), created=True
    ).run

    handed: list[float] = []
    outcome = run_workflow_run(
        run.id, hand_back=lambda _id, delay: handed.append(delay)
    )
    assert outcome == HANDED_BACK and handed

    attempts = [r["profile"] for r in agent.records() if r["step"] == "worker"]
    # Every account reports a rate limit: the first is cooled and the step moves; the
    # second one's report is the same task's second, so the task is held there (one
    # task marks at most one account, ledger/claims.py) before the move bound is
    # reached: its run waits, parked, and is not failed.
    assert len(attempts) == 2 and len(set(attempts)) == 2
    assert len(_moves(run)) == 1
    assert WorkflowEvent.objects.filter(
        workflow_run=run, event_type="task_parked"
    ).exists()
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.claimed_by is None


def test_a_pinned_profile_never_moves(agent: FakeAgent, tmp_path: Path) -> None:
    run = route_generic(
        tmp_path,
        "evt-failover-0",
        auth_profile_pool="acctA,acctB",
        worker_auth_profile="acctA",
        verifier_auth_profile="acctB",
        created=True,
    ).run
    agent.configure(profiles={"acctA": {"rate_limit": "HTTP 429"}})

    assert run_workflow_run(run.id) == RunStatus.FAILED
    assert steps_of(run)["worker"].account_profile == "acctA"
    assert _moves(run) == []

    # Cooling too: the pinned step waits rather than move.
    pinned = route_generic(
        tmp_path,
        "evt-failover-1",
        worker_auth_profile="acctA",
        auth_profile_pool="acctA,acctB",
        created=True,
    ).run
    claimed = services.run_claim(run_id=pinned.id, worker="w")
    assert claimed is not None
    outcome = services.step_start(step_run_id=steps_of(pinned)["worker"].id, worker="w")
    assert not outcome.started and outcome.wait_code == "cooldown"
    assert _moves(pinned) == []


def test_with_every_member_cooling_the_step_waits_and_ops_shows_why(
    agent: FakeAgent, tmp_path: Path, admin_client: Any
) -> None:
    run = route_generic(
        tmp_path, "evt-failover-0", auth_profile_pool="acctA,acctB", created=True
    ).run
    _cool("acctA")
    _cool("acctB")
    claimed = services.run_claim(run_id=run.id, worker="w")
    assert claimed is not None
    outcome = services.step_start(step_run_id=steps_of(run)["worker"].id, worker="w")

    # The whole pool cools: the step waits for the earliest end, and says so.
    assert not outcome.started and outcome.wait_code == "pool_rate_limited"
    assert outcome.retry_at is not None
    assert _moves(run) == []
    assert account_load_drift() == []
    page = admin_client.get("/ops/").content.decode()
    section = page.split('id="waiting"')[1].split("</section>")[0]
    worker = steps_of(run)["worker"].account_profile
    assert f"<code>{worker}</code>" in section
    until = timezone.localtime(outcome.retry_at).strftime("%H:%M")
    assert f"every account of the pool is rate limited until {until}" in section


def test_a_registered_claude_pool_is_routed_least_loaded_with_its_cap(
    agent: FakeAgent, tmp_path: Path
) -> None:
    for name in ("c1", "c2"):
        Account.objects.create(
            name=name,
            provider="claude",
            env_json={"CLAUDE_CONFIG_DIR": str(tmp_path / name)},
            max_running=1,
        )
    project = git_project(
        tmp_path / "repo"
    )  # claude needs the run's worktree (isolation)
    runs = [
        route_generic(
            project,
            f"evt-failover-{n}",
            provider="claude",
            auth_profile_pool="c1,c2",
            created=True,
        ).run
        for n in range(2)
    ]
    # Least-loaded: the second admission takes the other account for its worker.
    workers = {steps_of(r)["worker"].account_profile for r in runs}
    assert workers == {"c1", "c2"}
    # Both accounts now carry one reserved step: their own cap (1) defers the third.
    third = route_event(
        kind="generic",
        envelope={
            "id": "evt-failover-3",
            "type": "t",
            "source": "ci",
            "data": {"project_path": str(project), "title": "x"},
        },
        options=route_options({"provider": "claude", "auth_profile_pool": "c1,c2"}),
        env={},
    )
    assert third.kind == "throttled" and third.reason_code == "profile_cap"

    assert run_workflow_run(runs[0].id) == RunStatus.SUCCEEDED
    for record in agent.records():
        assert record["env"]["CLAUDE_CONFIG_DIR"] == str(tmp_path / record["profile"])


def test_an_unregistered_claude_pool_behaves_as_upstream(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = route_generic(
        git_project(tmp_path / "repo"),
        "evt-failover-0",
        provider="claude",
        auth_profile_pool="u1,u2",
        created=True,
    ).run
    assert run.invocation.scope_json["providerRouting"]["poolRouting"] is False


def test_a_wholly_disabled_pool_defers_with_its_own_reason(tmp_path: Path) -> None:
    for name in ("acctA", "acctB"):
        Account.objects.create(name=name, provider="codewith", enabled=False)
    result = route_event(
        kind="generic",
        envelope={
            "id": "evt-disabled",
            "type": "t",
            "source": "ci",
            "data": {"project_path": str(tmp_path), "title": "x"},
        },
        options=route_options({"auth_profile_pool": "acctA,acctB"}),
        env={},
    )
    assert result.kind == "throttled" and result.reason_code == "account_disabled"


@pytest.mark.parametrize(
    "pool", [["--config=/tmp/evil", "-p"], "acctA,-p", ["acct A", "b"]]
)
def test_pool_member_names_are_validated_at_admission(pool: Any) -> None:
    from domain.errors import ValidationError
    from ledger.models import WorkflowWorkItem

    with pytest.raises(ValidationError, match="not valid"):
        route_options({"auth_profile_pool": pool})
    with pytest.raises(ValidationError, match="not valid"):
        route_event(
            kind="generic",
            envelope={
                "id": "evt-bad-pool",
                "type": "t",
                "source": "ci",
                "data": {"title": "x", "project_path": "/srv/p"},
                "metadata": {"authProfilePool": pool},
            },
            options=route_options({}),
            env={},
        )
    assert not WorkflowWorkItem.objects.exists()


def test_a_whole_pool_wait_is_bounded_by_the_pool_wait_setting(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    """Within the bound the step waits for the earliest cooldown; a cooldown that ends
    past the bound, or a wait that has lasted it, ends the wait with the reason."""
    settings.LOOPSWEB_POOL_WAIT_SECONDS = 3600
    run = route_generic(
        tmp_path, "evt-failover-0", auth_profile_pool="acctA,acctB", created=True
    ).run
    _cool("acctA", minutes=30)
    _cool("acctB", minutes=20)
    assert services.run_claim(run_id=run.id, worker="w") is not None
    worker = steps_of(run)["worker"]
    waits = services.step_start(step_run_id=worker.id, worker="w")
    assert waits.wait_code == "pool_rate_limited"
    # The earliest end: acctB's.
    assert waits.retry_at is not None
    assert abs((waits.retry_at - timezone.now()) - timedelta(minutes=20)) < timedelta(
        minutes=1
    )
    # Ten minutes later the wait would reach the bound before acctB frees: it is over.
    settings.LOOPSWEB_POOL_WAIT_SECONDS = 15 * 60
    later = services.step_start(
        step_run_id=worker.id, worker="w", now=timezone.now() + timedelta(minutes=10)
    )
    assert later.wait_code == "pool_wait_over"
    assert later.wait_reason is not None
    assert later.wait_reason.startswith(
        "every account of the pool was rate limited for 900 s"
    )
    # One member frees: no pool wait at all, the step moves there and starts.
    AccountCooldown.objects.filter(account_profile="acctA").delete()
    started = services.step_start(step_run_id=worker.id, worker="w")
    assert started.started and started.step_run.account_profile == "acctA"


def test_a_pool_wait_past_its_bound_fails_the_run_with_the_reason(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_POOL_WAIT_SECONDS = 60  # both cool for 10 min: past the bound
    run = route_generic(
        tmp_path, "evt-failover-0", auth_profile_pool="acctA,acctB", created=True
    ).run
    _cool("acctA")
    _cool("acctB")
    assert run_workflow_run(run.id) == RunStatus.FAILED
    run.refresh_from_db()
    assert "every account of the pool was rate limited for 60 s" in (run.error or "")
    steps = steps_of(run)
    assert steps["verifier"].status == StepStatus.SKIPPED
    assert agent.records() == []  # no agent ran
    assert account_load_drift() == []
