"""Exit code 75 ("try later") and the re-dispatch bound (issue 58; ledger.services.retries,
docs/operations.md "Retries within an admission") with the real runner and the fake agent,
in this process."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from ledger.models import (
    AccountCooldown,
    RunStatus,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.services.retries import DEAD_LETTERED_CODE, redispatch_count
from runs.runner import NOT_DUE, run_workflow_run
from tests.ledger.runner_helpers import FakeAgent, route_created

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

TRY_LATER_ERROR = "step worker: the agent asked to try later (exit 75)"


def _runs(item_id: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(work_item_id=item_id).order_by("id"))


def _run_latest(item_id: str) -> str:
    """Run the item's newest run now (its backoff cleared); its final status."""
    latest = _runs(item_id)[-1]
    WorkflowRun.objects.filter(pk=latest.id).update(scheduled_for=None)
    return run_workflow_run(latest.id)


def test_exit_75_runs_again_later_and_the_attempt_is_refunded(
    agent: FakeAgent, tmp_path: Path, admin_client: Any
) -> None:
    agent.configure(steps={"worker": {"exit": 75}})
    # One attempt only: a failed run would fail the item; a try later does not.
    result = route_created(tmp_path, auth_profile="acctA", retry_backoff="5m")
    assert result.loop.max_attempts == 1
    item_id = result.work_item.id
    before = timezone.now()

    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    first, second = _runs(item_id)
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert item.status == WorkItemStatus.ADMITTED and item.attempts == 1
    assert item.workflow_run_id == second.id and second.status == RunStatus.QUEUED
    assert item.last_reason == (
        "the agent asked to try later (exit 75): step worker runs again in 300 s"
    )
    assert first.error == TRY_LATER_ERROR
    # After the route's backoff, not at once.
    assert second.scheduled_for is not None
    assert second.scheduled_for >= before + timedelta(seconds=300)
    assert run_workflow_run(second.id) == NOT_DUE
    event = first.events.get(event_type="step_try_later")
    assert event.step_id == "worker"
    assert event.payload_json is not None
    assert event.payload_json["exitCode"] == 75
    assert event.payload_json["retryRunId"] == second.id
    assert event.payload_json["redispatch"] == 1
    created = second.events.get(event_type="created").payload_json
    assert created is not None and created["tryLater"] is True
    assert created["attempt"] == 1  # the refunded attempt, run again
    page = admin_client.get(f"/ops/items/{item_id}/").content.decode()
    assert "the agent asked to try later (exit 75)" in page

    agent.configure()  # the agent can work now
    assert _run_latest(item_id) == RunStatus.SUCCEEDED
    item.refresh_from_db()
    assert item.status == WorkItemStatus.SUCCEEDED and item.attempts == 1
    assert [r.status for r in _runs(item_id)] == [RunStatus.FAILED, RunStatus.SUCCEEDED]
    assert [r["step"] for r in agent.records()] == ["worker", "worker", "verifier"]


def test_an_agent_that_always_exits_75_is_dead_lettered_past_the_bound(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_MAX_REDISPATCH = 2
    agent.configure(steps={"worker": {"exit": 75}})
    result = route_created(tmp_path, auth_profile="acctA", retry_backoff="0")
    item_id = result.work_item.id

    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    # No backoff on the route: a short default wait all the same.
    second = _runs(item_id)[1]
    assert second.scheduled_for is not None
    assert second.scheduled_for >= timezone.now() + timedelta(seconds=20)
    assert _run_latest(item_id) == RunStatus.FAILED
    assert redispatch_count(item_id) == 2
    assert _run_latest(item_id) == RunStatus.FAILED

    runs = _runs(item_id)
    assert len(runs) == 3  # two re-dispatches, then no third
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert item.status == WorkItemStatus.DEAD_LETTER
    assert item.reason_code == DEAD_LETTERED_CODE
    assert (
        item.last_reason == f"re-dispatched 2 times: dead-lettered ({TRY_LATER_ERROR})"
    )
    assert item.lease_expires_at is None and item.workflow_run_id == runs[2].id
    dead = runs[2].events.get(event_type="dead_lettered").payload_json
    assert dead is not None and dead["redispatches"] == 2
    assert not runs[2].events.filter(event_type="step_try_later").exists()


def test_loop_retries_count_toward_the_bound(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_MAX_REDISPATCH = 1
    agent.configure(steps={"worker": {"exit": 3}})
    result = route_created(
        tmp_path, auth_profile="acctA", max_attempts="5", retry_backoff="0"
    )
    item_id = result.work_item.id
    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    assert _run_latest(item_id) == RunStatus.FAILED

    assert len(_runs(item_id)) == 2  # attempts were left, the bound was not
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert item.status == WorkItemStatus.DEAD_LETTER
    assert item.last_reason == (
        "re-dispatched 1 times: dead-lettered "
        "(step worker failed: step exited with code 3)"
    )


def test_a_re_dispatch_after_a_rate_limit_never_counts(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    """Quota never dead-letters: with a bound of 0, a failure dead-letters at once, but a
    run whose step put its account in cooldown runs again (its loop retry or try later)."""
    settings.LOOPSWEB_MAX_REDISPATCH = 0
    agent.configure(
        steps={"worker": {"rate_limit": "HTTP 429 Too Many Requests", "exit": 75}}
    )
    result = route_created(
        tmp_path, auth_profile="acctA", max_attempts="2", retry_backoff="0"
    )
    item_id = result.work_item.id
    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    assert AccountCooldown.objects.filter(pk="acctA").exists()

    first, second = _runs(item_id)
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert item.status == WorkItemStatus.ADMITTED and item.workflow_run_id == second.id
    created = second.events.get(event_type="created").payload_json
    assert created is not None and created["rateLimited"] is True
    assert redispatch_count(item_id) == 0

    # The same bound with no rate limit: the first re-dispatch is refused.
    agent.configure(steps={"worker": {"exit": 3}})
    other = route_created(
        tmp_path, auth_profile="acctB", max_attempts="2", retry_backoff="0"
    )
    assert run_workflow_run(other.run.id) == RunStatus.FAILED
    dead = WorkflowWorkItem.objects.get(pk=other.work_item.id)
    assert dead.status == WorkItemStatus.DEAD_LETTER
    assert len(_runs(dead.id)) == 1
