"""Route admission against the real database (docs/upstream.md §2-§4, issue 3)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from domain.errors import ValidationError
from ledger import services
from ledger.models import (
    AccountCooldown,
    Loop,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemDeferral,
)
from tests.account_loads import assert_account_counts_match_rows
from tests.factories import make_work_item
from tests.routing.helpers import generic_event, route, todos_event

pytestmark = pytest.mark.django_db


def _finish(result, status: str = "succeeded") -> None:
    WorkflowWorkItem.objects.filter(pk=result.work_item.pk).update(status=status)
    WorkflowRun.objects.filter(pk=result.run.pk).update(status=status)
    WorkflowStepRun.objects.filter(workflow_run=result.run).update(status="succeeded")


def test_a_created_route_admits_the_item_with_spec_loop_queued_run_and_pending_steps() -> (
    None
):
    result = route("todos-task", todos_event("task-1"))
    assert result.kind == "created"
    item = WorkflowWorkItem.objects.get()
    assert item.status == "admitted" and item.attempts == 1
    assert (
        item.route_scope == "todos-task" and item.idempotency_key == "todos-task:task-1"
    )
    assert item.last_reason == "admitted by todos-task route"
    run = WorkflowRun.objects.get()
    assert (
        run.status == "queued"
        and item.workflow_run_id == run.id
        and run.work_item_id == item.id
    )
    assert [s.step_id for s in run.step_runs.order_by("sequence")] == [
        "worker",
        "verifier",
    ]
    assert set(run.step_runs.values_list("status", flat=True)) == {"pending"}
    assert (
        Loop.objects.get().max_attempts == 1
        and run.events.get().event_type == "created"
    )


def test_routing_the_same_event_again_dedupes_without_writing_a_second_item() -> None:
    event = generic_event()
    assert route(event=event).kind == "created"
    again = route(event=event)
    assert again.kind == "deduped" and again.work_item.status == "admitted"
    assert WorkflowWorkItem.objects.count() == 1 and WorkflowRun.objects.count() == 1


def test_each_route_scope_has_its_own_max_active() -> None:
    for _ in range(2):
        assert route(max_active=2, max_active_scope="drain-a").kind == "created"
    blocked = route(max_active=2, max_active_scope="drain-a")
    assert blocked.kind == "throttled" and blocked.reason_code == "route_cap"
    assert blocked.reason == "scope drain-a active workflow limit reached (2/2)"
    # A second router with its own scope is not blocked by the first one's items.
    assert route(max_active=2, max_active_scope="drain-b").kind == "created"


def test_the_loop_name_from_the_environment_is_the_default_scope() -> None:
    result = route(max_active=1, env={"LOOPS_LOOP_NAME": "nightly"})
    assert result.work_item.route_scope == "nightly"
    assert (
        route(max_active=1, env={"LOOPS_LOOP_NAME": "nightly"}).reason_code
        == "route_cap"
    )
    assert route(max_active=1).work_item.route_scope == "generic-event"


def test_project_and_group_caps_block_across_route_scopes() -> None:
    assert (
        route(
            event=generic_event(project="/srv/p1"),
            max_active_scope="a",
            max_active_per_project=1,
        ).kind
        == "created"
    )
    other_scope = route(
        event=generic_event(project="/srv/p1"),
        max_active_scope="b",
        max_active_per_project=1,
    )
    assert other_scope.reason_code == "project_cap"
    assert other_scope.reason == "project active workflow limit reached (1/1)"

    route(
        event=generic_event(project="/srv/p2", group="g"),
        max_active_scope="a",
        max_active_per_project_group=1,
    )
    group_blocked = route(
        event=generic_event(project="/srv/p3", group="g"),
        max_active_scope="c",
        max_active_per_project_group=1,
    )
    assert group_blocked.reason_code == "group_cap"
    assert group_blocked.reason == "project-group active workflow limit reached (1/1)"


def test_decision_order_is_scope_then_project_then_group() -> None:
    caps = {
        "max_active": 1,
        "max_active_per_project": 1,
        "max_active_per_project_group": 1,
    }
    route(event=generic_event(project="/srv/p", group="g"), **caps)
    assert (
        route(event=generic_event(project="/srv/p", group="g"), **caps).reason_code
        == "route_cap"
    )
    assert (
        route(
            event=generic_event(project="/srv/p", group="g"),
            max_active_scope="s2",
            **caps,
        ).reason_code
        == "project_cap"
    )
    assert (
        route(
            event=generic_event(project="/srv/q", group="g"),
            max_active_scope="s3",
            **caps,
        ).reason_code
        == "group_cap"
    )


def test_null_scope_rows_count_for_project_and_group_caps_but_never_for_a_scoped_cap() -> (
    None
):
    make_work_item(
        status="running",
        route_scope=None,
        project_key="/srv/legacy",
        project_group="lg",
    )
    assert (
        route(event=generic_event(project="/srv/legacy"), max_active=1).kind
        == "created"
    )
    assert (
        route(
            event=generic_event(project="/srv/legacy"),
            max_active_scope="x",
            max_active_per_project=1,
        ).reason_code
        == "project_cap"
    )
    assert (
        route(
            event=generic_event(project="/srv/other", group="lg"),
            max_active_scope="y",
            max_active_per_project_group=1,
        ).reason_code
        == "group_cap"
    )


def test_a_deferral_keeps_attempts_records_history_and_the_item_is_admitted_once_capacity_frees() -> (
    None
):
    first = route(max_active=1)
    event = generic_event()
    waiting = route(event=event, max_active=1)
    item = waiting.work_item
    assert (
        item.status == "deferred"
        and item.attempts == 0
        and item.reason_code == "route_cap"
    )
    assert item.last_reason == "scope generic-event active workflow limit reached (1/1)"
    assert Loop.objects.count() == 1 and WorkflowRun.objects.count() == 1
    deferral = WorkItemDeferral.objects.get(work_item=item)
    assert (
        deferral.counts_json["global"] == 1 and deferral.limits_json["maxActive"] == 1
    )

    assert (
        route(event=event, max_active=1).kind == "throttled"
    )  # re-evaluated, not deduped
    assert WorkItemDeferral.objects.filter(work_item=item).count() == 2
    _finish(first)
    admitted = route(event=event, max_active=1)
    assert admitted.kind == "created" and admitted.work_item.id == item.id
    assert admitted.work_item.attempts == 1 and admitted.work_item.reason_code is None


def test_the_per_profile_guard_defers_without_creating_a_loop_or_run() -> None:
    pool = {"auth_profile_pool": "acctA,acctB", "max_per_profile": 1}
    assert route(**pool).kind == "created"
    assert route(**pool).kind == "created"
    deferred = route(**pool)
    assert deferred.kind == "throttled" and deferred.reason_code == "profile_cap"
    assert (
        deferred.reason
        == "per-profile active limit reached (all 2 pool members >= 1 running; min 1)"
    )
    assert Loop.objects.count() == 2 and WorkflowRun.objects.count() == 2
    assert deferred.work_item.status == "deferred"


def test_seven_events_into_an_idle_pool_of_three_admit_six_and_defer_the_seventh() -> (
    None
):
    results = [
        route(auth_profile_pool="acctA,acctB,acctC", max_per_profile=2)
        for _ in range(7)
    ]
    assert [r.kind for r in results] == ["created"] * 6 + ["throttled"]
    assert results[-1].reason_code == "profile_cap"
    workers = WorkflowStepRun.objects.filter(step_id="worker").values_list(
        "account_profile", flat=True
    )
    assert sorted(workers) == ["acctA", "acctA", "acctB", "acctB", "acctC", "acctC"]
    for result in results[:6]:
        assert result.account_profiles["worker"] != result.account_profiles["verifier"]
        assert result.route_scope == "generic-event"


def test_pool_default_max_per_profile_is_two_and_zero_disables_the_guard() -> None:
    kinds = [route(auth_profile_pool="a,b").kind for _ in range(5)]
    assert kinds == ["created"] * 4 + ["throttled"]
    assert route(auth_profile_pool="a,b", max_per_profile=0).kind == "created"


def test_a_pinned_role_disables_pool_routing() -> None:
    result = route(
        auth_profile_pool="acctA,acctB", worker_auth_profile="pinned", max_per_profile=1
    )
    assert result.kind == "created" and not result.account_profiles
    steps = dict(result.run.step_runs.values_list("step_id", "account_profile"))
    assert steps["worker"] == "pinned"
    # No guard without pool routing: the pinned route is never deferred by load.
    assert (
        route(
            auth_profile_pool="acctA,acctB",
            worker_auth_profile="pinned",
            max_per_profile=1,
        ).kind
        == "created"
    )


def test_every_created_step_run_records_its_account_and_tool() -> None:
    pooled = route(
        "todos-task",
        todos_event(),
        template="task-lifecycle",
        auth_profile_pool="a,b,c",
        max_per_profile=0,
    )
    single = route(auth_profile="solo")
    for result in (pooled, single):
        for step in result.run.step_runs.all():
            assert step.account_profile and step.account_tool == "codewith", (
                step.step_id
            )
    assert set(pooled.run.step_runs.values_list("account_profile", flat=True)) == {
        "a",
        "b",
        "c",
    }
    assert pooled.account_profiles == dict(
        pooled.run.step_runs.values_list("step_id", "account_profile")
    )
    bare = route(
        provider="claude", sandbox="danger-full-access", manual_break_glass=True
    )
    assert set(bare.run.step_runs.values_list("account_profile", "account_tool")) == {
        (None, None)
    }


def test_reserved_steps_of_unstarted_runs_count_as_load() -> None:
    route(auth_profile_pool="acctA,acctB", max_per_profile=1)
    second = route(auth_profile_pool="acctA,acctB", max_per_profile=1)
    # Without reservations the second route would land on the same idle worker account.
    assert second.kind == "created"
    workers = WorkflowStepRun.objects.filter(step_id="worker").values_list(
        "account_profile", flat=True
    )
    assert sorted(workers) == ["acctA", "acctB"]


def test_cooling_accounts_are_skipped_and_all_cooling_defers_with_cooldown() -> None:
    until = timezone.now() + timedelta(minutes=10)
    AccountCooldown.objects.create(account_profile="acctA", until=until)
    result = route(auth_profile_pool="acctA,acctB,acctC", max_per_profile=0)
    assert "acctA" not in result.account_profiles.values()
    AccountCooldown.objects.create(
        account_profile="acctB", until=until + timedelta(minutes=5)
    )
    AccountCooldown.objects.create(
        account_profile="acctC", until=until + timedelta(minutes=1)
    )
    deferred = route(auth_profile_pool="acctA,acctB,acctC")
    assert deferred.kind == "throttled" and deferred.reason_code == "cooldown"
    assert until.strftime("%Y-%m-%dT%H:%M:%SZ") in deferred.reason


def test_ineligible_todos_tasks_are_skipped_and_write_nothing() -> None:
    result = route("todos-task", todos_event(tags=["auto:route", "manual"]))
    assert result.kind == "skipped" and result.reason.startswith(
        "task has disallowed tag"
    )
    event = todos_event()
    event["data"]["tags"] = []
    assert route("todos-task", event).reason == "missing explicit route opt-in"
    assert WorkflowWorkItem.objects.count() == 0


def test_a_finished_todos_task_is_re_admitted_after_backoff_keeping_attempts() -> None:
    event = todos_event("task-re")
    first = route("todos-task", event)
    _finish(first)
    assert route("todos-task", event).kind == "deduped"  # inside the 2-minute backoff
    with time_machine.travel(timezone.now() + timedelta(minutes=3)):
        again = route("todos-task", event)
    assert again.kind == "created" and again.work_item.attempts == 2
    assert again.requeue["previousAttempts"] == 1 and again.requeue["attempt"] == 2
    assert "re-admitted from succeeded" in again.work_item.last_reason


def test_finished_generic_items_are_never_re_admitted() -> None:
    event = generic_event()
    _finish(route(event=event))
    with time_machine.travel(timezone.now() + timedelta(hours=2)):
        assert route(event=event).kind == "deduped"


def test_the_redispatch_cap_keeps_deduping() -> None:
    event = todos_event("task-cap")
    first = route("todos-task", event)
    _finish(first, "failed")
    WorkflowWorkItem.objects.filter(pk=first.work_item.pk).update(attempts=8)
    with time_machine.travel(timezone.now() + timedelta(hours=2)):
        assert route("todos-task", event).kind == "deduped"


def test_dry_run_reports_the_real_decision_and_writes_nothing() -> None:
    route(max_active=1)
    before = (
        WorkflowWorkItem.objects.count(),
        WorkflowRun.objects.count(),
        WorkItemDeferral.objects.count(),
    )
    preview = route(max_active=1, dry_run=True)
    assert (
        preview.kind == "throttled"
        and preview.reason_code == "route_cap"
        and preview.dry_run
    )
    preview_created = route(max_active=2, dry_run=True, auth_profile_pool="a,b")
    assert preview_created.kind == "created" and preview_created.account_profiles
    after = (
        WorkflowWorkItem.objects.count(),
        WorkflowRun.objects.count(),
        WorkItemDeferral.objects.count(),
    )
    assert before == after


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_active": "-1"}, "--max-active must be a positive integer"),
        ({"max_active": "0"}, "--max-active must be a positive integer"),
        ({"max_per_profile": "-2"}, "--max-per-profile must be a non-negative integer"),
        (
            {"max_active_per_project": "two"},
            "--max-active-per-project must be a positive integer",
        ),
        (
            {"template": "nope"},
            "--template must be event-worker-verifier for generic routes",
        ),
    ],
)
def test_bad_options_raise_a_clear_error(raw, message) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(")):
        route(**raw)
    assert WorkflowWorkItem.objects.count() == 0


def test_a_claimed_run_whose_first_step_has_not_started_still_reserves_its_account() -> (
    None
):
    first = route(auth_profile_pool="acctA,acctB", max_per_profile=1)
    # The runner claimed the run but has not started the worker step yet.
    services.run_claim(run_id=first.run.pk, worker="host:1")
    second = route(auth_profile_pool="acctA,acctB", max_per_profile=1)
    assert second.kind == "created"
    assert second.account_profiles["worker"] != first.account_profiles["worker"]
    assert (
        route(auth_profile_pool="acctA,acctB", max_per_profile=1).reason_code
        == "profile_cap"
    )
    # Once a step of the first run has run, its later steps no longer reserve anything.
    worker = WorkflowStepRun.objects.get(workflow_run=first.run, step_id="worker")
    assert services.step_start(step_run_id=worker.id, worker="host:1").started
    services.step_finish(step_run_id=worker.id, status="succeeded")
    assert route(auth_profile_pool="acctA,acctB", max_per_profile=1).kind == "created"
    assert_account_counts_match_rows()
