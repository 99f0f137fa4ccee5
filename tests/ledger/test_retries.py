"""Loop-level retries (`--max-attempts`, `--retry-backoff`; docs/upstream.md §2.1, §2.2) with the real
runner and the fake agent, in this process, on both databases."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django_q.models import Schedule

from domain.errors import ValidationError
from domain.retry import retry_backoff_seconds
from ledger import services
from ledger.models import (
    LoopStatus,
    RunStatus,
    SpecStatus,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.selectors import active_counts
from routing.admission import (
    THROTTLED,
    retry_work_item,
    route_options,
)
from runs.runner import NOT_DUE, run_workflow_run
from tests.ledger.runner_helpers import FakeAgent, route_created, route_generic

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

WORKER_FAILED = "step worker failed: step exited with code 3"


def _runs(item_id: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(work_item_id=item_id).order_by("created_at"))


def test_a_run_failing_twice_then_succeeding_with_three_attempts_succeeds_once_admitted(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.configure(steps={"worker": {"exit": 3}})
    result = route_created(
        tmp_path, auth_profile="acctA", max_attempts="3", retry_backoff="0"
    )
    assert (result.loop.max_attempts, result.loop.retry_delay_ms) == (3, 0)
    item_id = result.work_item.id

    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    item = WorkflowWorkItem.objects.get(pk=item_id)
    first, second = _runs(item_id)
    # Retry pending: the item never left `admitted`, bound to the next run; no new admission.
    assert item.status == WorkItemStatus.ADMITTED and item.attempts == 1
    assert item.last_reason == f"attempt failed; retry pending: {WORKER_FAILED}"
    assert item.workflow_run_id == second.id and second.status == RunStatus.QUEUED
    assert second.loop_id == first.loop_id and second.workflow_id == first.workflow_id
    created = second.events.get(event_type="created").payload_json
    assert created is not None
    assert created["attempt"] == 2 and created["retryOf"] == first.id
    scheduled = first.events.get(event_type="retry_scheduled").payload_json
    assert scheduled is not None and scheduled["retryRunId"] == second.id
    # The same accounts as the failed attempt.
    assert list(
        second.step_runs.order_by("sequence").values_list("step_id", "account_profile")
    ) == list(
        first.step_runs.order_by("sequence").values_list("step_id", "account_profile")
    )

    assert run_workflow_run(second.id) == RunStatus.FAILED
    third = _runs(item_id)[2]
    agent.configure()  # the flaky agent recovers
    assert run_workflow_run(third.id) == RunStatus.SUCCEEDED

    item.refresh_from_db()
    runs = _runs(item_id)
    assert item.status == WorkItemStatus.SUCCEEDED and item.attempts == 1
    # The retry pending reason does not outlive the success.
    assert item.last_reason == "succeeded on attempt 3"
    assert [r.status for r in runs] == [
        RunStatus.FAILED,
        RunStatus.FAILED,
        RunStatus.SUCCEEDED,
    ]
    assert item.workflow_run_id == runs[2].id
    loop = result.loop
    loop.refresh_from_db()
    assert loop.status == LoopStatus.STOPPED
    spec = runs[0].workflow
    spec.refresh_from_db()
    assert spec.status == SpecStatus.ARCHIVED  # only once the last attempt ended
    from tests.account_loads import assert_account_counts_match_rows

    assert_account_counts_match_rows()
    # The agent really ran three times (worker, worker, worker + verifier).
    assert [r["step"] for r in agent.records()] == [
        "worker",
        "worker",
        "worker",
        "verifier",
    ]


def test_with_two_attempts_the_item_fails_naming_the_last_error(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.configure(steps={"worker": {"exit": 3}})
    result = route_created(
        tmp_path, auth_profile="acctA", max_attempts=2, retry_backoff=0
    )
    item_id = result.work_item.id
    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    agent.configure(steps={"worker": {"exit": 4}})
    assert run_workflow_run(_runs(item_id)[1].id) == RunStatus.FAILED

    item = WorkflowWorkItem.objects.get(pk=item_id)
    runs = _runs(item_id)
    assert len(runs) == 2 and item.status == WorkItemStatus.FAILED
    assert item.last_reason == "step worker failed: step exited with code 4"
    assert item.attempts == 1 and item.workflow_run_id == runs[1].id
    assert not runs[1].events.filter(event_type="retry_scheduled").exists()
    spec = runs[1].workflow
    spec.refresh_from_db()
    assert spec.status == SpecStatus.ARCHIVED


def test_the_default_is_one_attempt_as_upstream(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.configure(steps={"worker": {"exit": 3}})
    result = route_created(tmp_path, auth_profile="acctA")
    assert result.loop.max_attempts == 1
    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    item = WorkflowWorkItem.objects.get(pk=result.work_item.id)
    assert item.status == WorkItemStatus.FAILED and item.last_reason == WORKER_FAILED
    assert len(_runs(item.id)) == 1


def test_the_backoff_is_respected_and_doubles_up_to_the_cap(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS = 100
    result = route_created(
        tmp_path, auth_profile="acctA", max_attempts=4, retry_backoff="1m"
    )
    assert result.loop.retry_delay_ms == 60_000
    item_id = result.work_item.id
    first = result.run
    claimed = services.run_claim(run_id=first.id, worker="w:1")
    assert claimed is not None and claimed.started_at is not None
    first_end = claimed.started_at + timedelta(seconds=5)
    services.run_finalize(
        run_id=first.id, status=RunStatus.FAILED, error="boom 1", now=first_end
    )
    second = _runs(item_id)[1]
    assert second.scheduled_for == first_end + timedelta(seconds=60)
    # Handed to the run queue for its due time (a one-off django-q2 schedule).
    schedule = Schedule.objects.get(name=f"run-workflow-{second.id}")
    assert schedule.func == "runs.tasks.run_workflow"
    assert schedule.next_run == second.scheduled_for
    assert schedule.schedule_type == Schedule.ONCE
    # Not before: a delivery before the backoff ended claims nothing and writes nothing.
    early = second.scheduled_for - timedelta(seconds=1)
    assert services.run_claim(run_id=second.id, worker="w:1", now=early) is None
    assert run_workflow_run(second.id) == NOT_DUE
    second.refresh_from_db()
    assert second.status == RunStatus.QUEUED and second.started_at is None
    # At the due time it runs; the second failure doubles the delay (120 s), capped at 100 s.
    assert services.run_claim(run_id=second.id, worker="w:1", now=second.scheduled_for)
    second_end = second.scheduled_for + timedelta(seconds=2)
    services.run_finalize(
        run_id=second.id, status=RunStatus.TIMED_OUT, error="slow", now=second_end
    )
    third = _runs(item_id)[2]
    assert third.scheduled_for == second_end + timedelta(seconds=100)
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert item.last_reason == "attempt failed; retry pending: slow"
    assert retry_backoff_seconds(60, 1, 3600) == 60
    assert retry_backoff_seconds(60, 3, 3600) == 240
    assert retry_backoff_seconds(0, 3, 3600) == 0


def test_caps_count_a_retrying_item_as_active_while_it_waits(
    agent: FakeAgent, tmp_path: Path
) -> None:
    result = route_created(
        tmp_path,
        auth_profile="acctA",
        max_attempts=3,
        retry_backoff="10m",
        max_active="1",
        max_active_scope="nightly",
    )
    run = services.run_claim(run_id=result.run.id, worker="w:1")
    assert run is not None
    services.run_finalize(run_id=run.id, status=RunStatus.FAILED, error="flaky")
    item = WorkflowWorkItem.objects.get(pk=result.work_item.id)
    assert item.status == WorkItemStatus.ADMITTED  # waiting for its retry
    counts = active_counts(scope="nightly", project_key=None, project_group=None)
    assert counts.scope == 1

    other = route_generic(
        tmp_path, auth_profile="acctA", max_active="1", max_active_scope="nightly"
    )
    assert other.kind == THROTTLED
    assert other.reason == "scope nightly active workflow limit reached (1/1)"
    assert (
        active_counts(scope="nightly", project_key=None, project_group=None).scope == 1
    )


def test_a_cancelled_run_is_never_retried(agent: FakeAgent, tmp_path: Path) -> None:
    result = route_created(
        tmp_path, auth_profile="acctA", max_attempts=3, retry_backoff=0
    )
    services.run_cancel(run_id=result.run.id, reason="not wanted")
    item = WorkflowWorkItem.objects.get(pk=result.work_item.id)
    assert item.status == WorkItemStatus.CANCELLED and len(_runs(item.id)) == 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_attempts": "0"}, "--max-attempts must be a positive integer"),
        ({"max_attempts": "two"}, "--max-attempts must be a positive integer"),
        ({"max_attempts": 101}, "--max-attempts must be at most 100"),
        (
            {"retry_backoff": "-5"},
            "--retry-backoff must be a non-negative duration in seconds, like 30, 30s, 5m or 1h",
        ),
        (
            {"retry_backoff": "5d"},
            "--retry-backoff must be a non-negative duration in seconds, like 30, 30s, 5m or 1h",
        ),
        (
            {"retry_backoff": "200h"},
            "--retry-backoff must be at most 604800 seconds (7 days)",
        ),
    ],
)
def test_bad_retry_options_are_refused_with_a_clear_message(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as err:
        route_options(raw)
    assert str(err.value) == message


def test_retry_options_reach_drain_and_schedule_records() -> None:
    from routing.drains import drain_options

    drain = drain_options(
        "generic", {"max_attempts": "3", "retry_backoff": "30s", "max_dispatch": "2"}
    )
    assert drain.route.max_attempts == 3 and drain.route.retry_backoff == 30
    stored = drain.to_dict()
    assert stored["max_attempts"] == 3 and stored["retry_backoff"] == 30
    # A schedule replays its stored options: the values parse back unchanged.
    again = drain_options("generic", {k: v for k, v in stored.items() if k != "kind"})
    assert again.route == drain.route


def test_the_ops_item_page_shows_each_attempt_and_why_it_ended(
    agent: FakeAgent, tmp_path: Path, admin_client: Any
) -> None:
    from django.urls import reverse

    agent.configure(steps={"worker": {"exit": 3}})
    result = route_created(
        tmp_path, auth_profile="acctA", max_attempts=3, retry_backoff="5m"
    )
    item_id = result.work_item.id
    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    page = admin_client.get(reverse("ops:work-item", args=[item_id]))
    assert page.status_code == 200
    body = page.content.decode()
    runs = page.context["runs"]
    assert [(r.run.attempt, r.run.status) for r in runs] == [
        (2, "queued"),
        (1, "failed"),
    ]
    assert WORKER_FAILED in body and "retry due" in body
    assert f"attempt failed; retry pending: {WORKER_FAILED}" in body


def test_the_commands_take_the_retry_options() -> None:
    import ast
    import io
    import json

    from django.core.management import call_command

    call_command(
        "schedule_drain",
        "nightly",
        "generic",
        "--every",
        "5m",
        "--max-attempts",
        "3",
        "--retry-backoff",
        "30s",
        stdout=io.StringIO(),
    )
    stored = ast.literal_eval(Schedule.objects.get(name="nightly").kwargs)["options"]
    assert stored["max_attempts"] == 3 and stored["retry_backoff"] == 30

    out = io.StringIO()
    event = {
        "id": "evt-cmd-retry",
        "type": "t",
        "source": "s",
        "data": {"project_path": "/srv/app"},
    }
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(event),
        "--max-attempts",
        "2",
        "--json",
        stdout=out,
    )
    loop_id = json.loads(out.getvalue())["loop"]["id"]
    from ledger.models import Loop

    assert Loop.objects.get(pk=loop_id).max_attempts == 2


def test_a_run_whose_lease_expired_is_retried_when_attempts_are_left(
    agent: FakeAgent, tmp_path: Path
) -> None:
    from django.utils import timezone

    from runs.tasks import run_workflow

    result = route_created(
        tmp_path, auth_profile="acctA", max_attempts=2, retry_backoff="1h"
    )
    run = services.run_claim(run_id=result.run.id, worker="gone-host:1")
    assert run is not None
    later = timezone.now() + timedelta(hours=1)
    (recovered,) = services.runs_recover_expired(now=later)
    assert recovered.run_id == run.id
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert item.status == WorkItemStatus.ADMITTED
    assert item.last_reason == (
        "attempt failed; retry pending: workflow run lease expired before completion "
        "(claimed_by=gone-host:1)"
    )
    retry = WorkflowRun.objects.get(pk=item.workflow_run_id)
    assert retry.scheduled_for == later + timedelta(hours=1)
    # The django-q2 task delivered early (a stale hand-over) schedules it for its due time.
    Schedule.objects.filter(name=f"run-workflow-{retry.id}").delete()
    assert run_workflow(retry.id) == NOT_DUE
    assert (
        Schedule.objects.get(name=f"run-workflow-{retry.id}").next_run
        == retry.scheduled_for
    )


def test_a_drain_stores_the_retry_options_on_every_loop_it_admits() -> None:
    from ledger.models import Loop
    from routing.drains import drain_options, drain_run
    from routing.drains.inbox import inbox_ingest
    from tests.account_loads import assert_account_counts_match_rows
    from tests.routing.helpers import generic_event

    inbox_ingest(
        enumerate([generic_event(project=f"/srv/d{i}") for i in range(3)], start=1)
    )
    report = drain_run(
        options=drain_options(
            "generic",
            {"max_attempts": "3", "retry_backoff": "90", "max_dispatch": "3"},
        )
    )
    assert report.counts["created"] == 3
    assert set(Loop.objects.values_list("max_attempts", "retry_delay_ms")) == {
        (3, 90_000)
    }
    assert_account_counts_match_rows()


def test_the_api_item_detail_numbers_each_attempt(client: Any) -> None:
    from tests.routing.api.helpers import bearer, make_token
    from tests.routing.helpers import generic_event, route

    result = route(event=generic_event(), max_attempts="2", retry_backoff="30")
    assert result.run is not None and result.work_item is not None
    services.run_claim(run_id=result.run.id, worker="w:1")
    services.run_finalize(run_id=result.run.id, status=RunStatus.FAILED, error="boom")
    _, token = make_token("read")
    body = client.get(
        f"/api/v1/work-items/{result.work_item.id}", **bearer(token)
    ).json()
    assert body["lastReason"] == "attempt failed; retry pending: boom"
    assert [(r["attempt"], r["status"], r["error"]) for r in body["runs"]] == [
        (1, "failed", "boom"),
        (2, "queued", None),
    ]
    assert body["runs"][1]["scheduledFor"] is not None


def test_a_retried_item_that_succeeds_says_so_and_numbers_every_run(
    client: Any, admin_client: Any
) -> None:
    """Issue 62 item 4: after a failed attempt and a successful retry the item read
    `succeeded` with `attempt failed; retry pending: ...` still, and the runs of an item
    re-admitted by an operator's retry (a new loop) both read "attempt 1" on the page."""
    from django.urls import reverse

    from tests.routing.api.helpers import bearer, make_token
    from tests.routing.helpers import generic_event, route

    def end(run_id: str, status: str, error: str | None = None) -> None:
        services.run_claim(run_id=run_id, worker="w:1")
        services.run_finalize(run_id=run_id, status=status, error=error)

    result = route(event=generic_event(), max_attempts="2", retry_backoff="30")
    assert result.run is not None and result.work_item is not None
    item_id = result.work_item.id
    end(result.run.id, RunStatus.FAILED, "boom")
    end(_runs(item_id)[1].id, RunStatus.SUCCEEDED)
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert (item.status, item.last_reason) == ("succeeded", "succeeded on attempt 2")

    # An operator's retry re-admits it in a new loop: its run is the third attempt.
    retry_work_item(item_id=item_id)
    third = _runs(item_id)[2]
    assert third.loop_id != result.run.loop_id
    end(third.id, RunStatus.SUCCEEDED)
    item.refresh_from_db()
    assert item.last_reason == "succeeded on attempt 3"

    _, token = make_token("read")
    body = client.get(f"/api/v1/work-items/{item_id}", **bearer(token)).json()
    assert body["lastReason"] == "succeeded on attempt 3"
    numbered = [(r["attempt"], r["status"]) for r in body["runs"]]
    assert numbered == [(1, "failed"), (2, "succeeded"), (3, "succeeded")]
    page = admin_client.get(reverse("ops:work-item", args=[item_id]))
    assert [(r.run.attempt, r.run.status) for r in page.context["runs"]] == [
        (3, "succeeded"),
        (2, "succeeded"),
        (1, "failed"),
    ]
    assert "succeeded on attempt 3" in page.content.decode()


def test_a_retry_after_a_rate_limit_starts_on_a_free_pool_member(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    """The retry is admitted on the failed attempt's accounts; the account rules (issue 15's
    failover at step start) then move its step off the account the rate limit left cooling."""
    settings.LOOPSWEB_RATE_LIMIT_MOVES = 0  # the rate limit fails the attempt itself
    # Three accounts: the verifier keeps one that is neither the worker's nor cooling
    # (worker != verifier; with two it would wait for the cooldown).
    result = route_created(
        tmp_path, auth_profile_pool="acctA,acctB,acctC", max_attempts=2, retry_backoff=0
    )
    item_id = result.work_item.id
    limited = result.run.step_runs.get(step_id="worker").account_profile
    assert limited is not None
    agent.configure(profiles={limited: {"rate_limit": "HTTP 429 Too Many Requests"}})

    assert run_workflow_run(result.run.id) == RunStatus.FAILED
    first, second = _runs(item_id)
    assert second.status == RunStatus.QUEUED
    assert second.step_runs.get(step_id="worker").account_profile == limited

    assert run_workflow_run(second.id) == RunStatus.SUCCEEDED
    other = second.step_runs.get(step_id="worker").account_profile
    assert other not in (limited, None)
    assert second.step_runs.get(step_id="verifier").account_profile != other
    (move,) = [
        e.payload_json
        for e in second.events.filter(event_type="step_account_moved")
        if e.step_id == "worker"
    ]
    assert move is not None and (move["from"], move["to"]) == (limited, other)
    worker_profiles = [r["profile"] for r in agent.records() if r["step"] == "worker"]
    assert worker_profiles == [limited, other]
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert item.status == WorkItemStatus.SUCCEEDED and item.attempts == 1
    from tests.account_loads import assert_account_counts_match_rows

    assert_account_counts_match_rows()
