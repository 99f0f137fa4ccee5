"""A per-minute limit pauses, it does not rotate (ledger.services.failover rule 7), with the
fake agent in this process: a 429 naming a reset at most LOOPSWEB_THROTTLE_SECONDS off
cools the account until then and the step runs again on the SAME account after it (an
attempt row each, a `step_waiting` event `account_paused`, no move), both inline and as a
django-q2 task (the run parked meanwhile, holding no worker); a longer reset moves the step
to the pool's other account, as an exhausted window does."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from ledger.models import AccountCooldown, AccountWindow, RunStatus, WorkflowEvent
from ledger.services.failover import ACCOUNT_PAUSED_CODE
from runs.runner import HANDED_BACK, run_workflow_run
from tests.ledger.account_failover_helpers import attempts_of, pooled_run
from tests.ledger.runner_helpers import FakeAgent, git_project

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

POOL = ["acctA", "acctB"]


def _limited_once(agent: FakeAgent, tmp_path: Path, seconds: int) -> None:
    agent.configure(
        steps={
            "worker": {
                "rate_limit": f"HTTP 429 Too Many Requests. Retry-After: {seconds}",
                "exit_once": str(tmp_path / "limited-once"),
            }
        }
    )


def _events(run_id: str, event_type: str) -> list[dict[str, Any]]:
    return [
        e.payload_json or {}
        for e in WorkflowEvent.objects.filter(
            workflow_run_id=run_id, event_type=event_type
        ).order_by("sequence")
    ]


def test_a_per_minute_429_waits_on_its_account_and_does_not_rotate(
    agent: FakeAgent, tmp_path: Path
) -> None:
    _limited_once(agent, tmp_path, 2)
    run = pooled_run(git_project(tmp_path / "project"), POOL)
    began = timezone.now()

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    # The same account twice: paused, not moved; the second try after the reset.
    assert attempts_of(run) == [("acctA", "rate_limited"), ("acctA", "succeeded")]
    assert not _events(run.id, "step_account_moved")
    (paused,) = [
        e
        for e in _events(run.id, "step_waiting")
        if e.get("code") == ACCOUNT_PAUSED_CODE
    ]
    assert "acctA answered a per-minute rate limit" in paused["reason"]
    cooldown = AccountCooldown.objects.get(pk="acctA")
    assert began + timedelta(seconds=1) < cooldown.until
    assert cooldown.until <= timezone.now()  # over by the time it ran again
    tried = [r["profile"] for r in agent.records() if r["step"] == "worker"]
    assert tried == ["acctA", "acctA"]


def test_a_paused_run_is_handed_back_for_the_reset_and_resumes_on_the_account(
    agent: FakeAgent, tmp_path: Path
) -> None:
    _limited_once(agent, tmp_path, 15)
    run = pooled_run(git_project(tmp_path / "project"), POOL)
    handed: list[tuple[datetime, float]] = []

    def hand_back(_run_id: str, delay: float) -> None:
        handed.append((timezone.now(), delay))

    assert run_workflow_run(run.id, hand_back=hand_back) == HANDED_BACK
    # Parked until the reset and at most a quarter of the pause more (the stagger),
    # holding no worker: the task comes back no sooner than the account is free.
    ((at, delay),) = handed
    reset = AccountCooldown.objects.get(pk="acctA").until
    assert at + timedelta(seconds=delay) >= reset - timedelta(seconds=0.05)
    assert delay <= 15 * 1.25
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.claimed_by is None
    assert attempts_of(run) == [("acctA", "rate_limited")]
    # Once the reset has passed (the cooldown and the 429's window row moved to now: the
    # time the pause lasts), it resumes there.
    now = timezone.now()
    AccountCooldown.objects.filter(pk="acctA").update(until=now)
    AccountWindow.objects.filter(account_profile="acctA").update(resets_at=now)
    assert run_workflow_run(run.id, hand_back=hand_back) == RunStatus.SUCCEEDED
    assert attempts_of(run) == [("acctA", "rate_limited"), ("acctA", "succeeded")]
    assert not _events(run.id, "step_account_moved")


def test_a_longer_limit_moves_the_step_to_the_other_account(
    agent: FakeAgent, tmp_path: Path
) -> None:
    _limited_once(agent, tmp_path, 30)  # opencode's Retry-After: 30 moves
    run = pooled_run(git_project(tmp_path / "project"), POOL)

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert attempts_of(run) == [("acctA", "rate_limited"), ("acctB", "succeeded")]
    (moved,) = _events(run.id, "step_account_moved")
    assert (moved["from"], moved["to"]) == ("acctA", "acctB")
    assert not [
        e
        for e in _events(run.id, "step_waiting")
        if e.get("code") == ACCOUNT_PAUSED_CODE
    ]


def test_after_three_pauses_across_hand_backs_the_step_moves(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.configure(
        profiles={"acctA": {"rate_limit": "HTTP 429 Too Many Requests. Retry-After: 2"}}
    )
    run = pooled_run(git_project(tmp_path / "project"), POOL)
    handed: list[float] = []

    def hand_back(_run_id: str, delay: float) -> None:
        handed.append(delay)

    outcomes = []
    for _ in range(4):
        outcomes.append(run_workflow_run(run.id, hand_back=hand_back))
        if outcomes[-1] != HANDED_BACK:
            break
        # The reset has passed (the time a pause lasts): the run resumes.
        now = timezone.now()
        AccountCooldown.objects.filter(pk="acctA").update(until=now)
        AccountWindow.objects.filter(account_profile="acctA").update(resets_at=now)
    # Three pauses, each its own delivery of the run's task, then the fourth limit moves.
    assert outcomes == [HANDED_BACK] * 3 + [RunStatus.SUCCEEDED], outcomes
    assert attempts_of(run) == [("acctA", "rate_limited")] * 4 + [
        ("acctB", "succeeded")
    ]
    (moved,) = _events(run.id, "step_account_moved")
    assert (moved["from"], moved["to"]) == ("acctA", "acctB")
