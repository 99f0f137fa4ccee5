"""Retry keeps the route (issue 39): every admission stores its route on the item, and an
operator's retry re-admits the item now with it; the caps still apply."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils.module_loading import import_string

from domain.errors import ApplicationError
from ledger import services
from ledger.admin.actions import RETRY_ITEM_OPERATION, RETRY_RUN_OPERATION
from ledger.models import (
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemDeferral,
)
from routing.admission import retry_outcome, retry_run, retry_work_item
from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from tests.factories import make_work_item
from tests.routing.helpers import generic_event, route, todos_event

pytestmark = pytest.mark.django_db

# A route nobody would guess from `drain todos-task` alone: another provider, a pool of two
# registered accounts, a per-profile cap, a named scope with a cap, and time limits.
ROUTE = {
    "provider": "codex",
    "auth_profile_pool": "cx-a,cx-b",
    "max_per_profile": 1,
    "max_active": 1,
    "max_active_scope": "night",
    "step_timeout": 600,
    "step_idle_timeout": 120,
}


@pytest.fixture
def codex_pool() -> None:
    for name in ("cx-a", "cx-b"):
        services.account_add(name=name, provider="codex")


def accounts_of(run_id: str) -> list[tuple[str | None, str | None]]:
    return list(
        WorkflowStepRun.objects.filter(workflow_run_id=run_id)
        .order_by("sequence")
        .values_list("account_profile", "account_tool")
    )


def fail(item: WorkflowWorkItem) -> str:
    item.refresh_from_db()
    assert item.workflow_run_id is not None
    run_id = item.workflow_run_id
    services.run_finalize(run_id=run_id, status="failed", error="exit 1")
    item.refresh_from_db()
    assert item.status == "failed"
    return run_id


def test_an_admission_stores_its_route_with_the_item(codex_pool) -> None:
    event = todos_event("T-store")
    result = route("todos-task", event, **ROUTE, sandbox="read-only")
    assert result.kind == "created"
    stored = WorkflowWorkItem.objects.get().route_options_json
    assert stored["kind"] == "todos-task" and stored["event"] == event
    assert stored["options"] == {
        "provider": "codex",
        "auth_profile_pool": "cx-a,cx-b",
        "max_per_profile": 1,
        "max_active": 1,
        "max_active_scope": "night",
        "sandbox": "read-only",
        "step_timeout": 600,
        "step_idle_timeout": 120,
    }


def test_a_drain_stores_the_scope_it_resolved(codex_pool) -> None:
    """A scheduled drain's scope comes from its name (LOOPS_LOOP_NAME): the item keeps it."""
    inbox_ingest(enumerate([generic_event()]))
    raw = {k: v for k, v in ROUTE.items() if k != "max_active_scope"}
    drain_run(options=drain_options("generic", raw), env={"LOOPS_LOOP_NAME": "hourly"})
    item = WorkflowWorkItem.objects.get()
    assert item.route_scope == "hourly"
    assert item.route_options_json["options"]["max_active_scope"] == "hourly"


def test_retry_readmits_now_with_the_stored_provider_pool_and_scope(
    codex_pool,
) -> None:
    first = route("todos-task", todos_event("T-1"), **ROUTE).work_item
    assert {tool for _, tool in accounts_of(first.workflow_run_id)} == {"codex"}
    failed_run = fail(first)

    item = retry_run(run_id=failed_run, actor="ops-user")

    assert (item.status, item.attempts, item.route_scope) == ("admitted", 2, "night")
    assert item.workflow_run_id != failed_run
    again = accounts_of(item.workflow_run_id)
    assert {tool for _, tool in again} == {"codex"}
    assert {profile for profile, _ in again} == {"cx-a", "cx-b"}
    assert WorkflowRun.objects.get(pk=item.workflow_run_id).status == "queued"
    event = WorkflowEvent.objects.get(
        workflow_run_id=failed_run, event_type="operator_retry"
    )
    assert event.payload_json["user"] == "ops-user"
    assert retry_outcome(item).startswith(f"retried {item.id}: admitted again as run")


def test_retry_of_an_inbox_item_records_the_outcome_on_its_event(codex_pool) -> None:
    inbox_ingest(enumerate([todos_event("T-inbox")]))
    drain_run(options=drain_options("todos-task", ROUTE))
    item = WorkflowWorkItem.objects.get()
    fail(item)
    retry_work_item(item_id=item.id)
    row = InboxEvent.objects.get()
    assert (row.state, row.work_item_id) == ("admitted", item.id)
    # A drain with none of the options finds nothing to do: the item runs on its route.
    report = drain_run(options=drain_options("todos-task", {}))
    assert report.counts["created"] == 0
    item.refresh_from_db()
    assert {t for _, t in accounts_of(item.workflow_run_id)} == {"codex"}


def test_a_retry_writes_its_inbox_rows_once(codex_pool) -> None:
    """One admission operation: the inbox row is written with the outcome, not reopened
    to pending first and then admitted in the same transaction."""
    inbox_ingest(enumerate([todos_event("T-once")]))
    drain_run(options=drain_options("todos-task", ROUTE))
    item = WorkflowWorkItem.objects.get()
    fail(item)
    table = InboxEvent._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        retry_work_item(item_id=item.id)
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith(f'UPDATE "{table}"')
    ]
    assert len(writes) == 1, writes
    assert InboxEvent.objects.get().state == "admitted"


def test_an_item_without_a_stored_route_is_reopened_for_the_next_drain() -> None:
    inbox_ingest(enumerate([todos_event("T-old")]))
    drain_run(options=drain_options("todos-task", {}))
    item = WorkflowWorkItem.objects.get()
    WorkflowWorkItem.objects.filter(pk=item.pk).update(route_options_json=None)
    fail(item)
    item = retry_work_item(item_id=item.id)
    assert item.status == "queued"
    assert InboxEvent.objects.get().state == "pending"
    assert "stores no route" in retry_outcome(item)


def test_the_admins_retry_actions_reach_admissions_retry() -> None:
    """The ledger's admin reaches the retry by its dotted path (it imports nothing above
    the ledger): each path names the operation."""
    assert import_string(RETRY_ITEM_OPERATION) is retry_work_item
    assert import_string(RETRY_RUN_OPERATION) is retry_run


def test_a_capped_retry_waits_as_a_deferral_and_keeps_its_route(codex_pool) -> None:
    first = route(event=generic_event(), **ROUTE).work_item
    failed_run = fail(first)
    holder = route(event=generic_event(), **ROUTE)  # takes the scope's one slot
    assert holder.kind == "created"

    item = retry_run(run_id=failed_run)

    assert (item.status, item.reason_code) == ("deferred", "route_cap")
    deferral = WorkItemDeferral.objects.filter(work_item=item).get()
    assert deferral.route_scope == "night" and "night" in deferral.reason
    assert deferral.limits_json["maxActive"] == 1
    assert retry_outcome(item).startswith(f"retried {item.id}: deferred (route_cap)")
    assert item.route_options_json["retry"] is True

    # The slot frees; the next delivery of the event, with no options at all, admits the
    # item on its stored route (provider, pool, scope), not as a default route.
    services.run_finalize(run_id=holder.run.id, status="succeeded")
    again = route(event=item.route_options_json["event"])
    assert again.kind == "created" and again.work_item.id == item.id
    item.refresh_from_db()
    assert (item.status, item.route_scope) == ("admitted", "night")
    assert {t for _, t in accounts_of(item.workflow_run_id)} == {"codex"}
    assert "retry" not in item.route_options_json


def test_a_drain_admits_a_deferred_retry_on_its_stored_route(codex_pool) -> None:
    inbox_ingest(enumerate([generic_event(), generic_event()]))
    drain_run(options=drain_options("generic", {**ROUTE, "max_dispatch": 2}))
    first = WorkflowWorkItem.objects.get()  # the second is held: the scope's one slot
    fail(first)
    drain_run(options=drain_options("generic", ROUTE))  # the freed slot: the second
    second = WorkflowWorkItem.objects.exclude(pk=first.pk).get()
    assert second.status == "admitted"
    item = retry_work_item(item_id=first.id)
    assert item.status == "deferred"
    assert InboxEvent.objects.get(work_item_id=first.id).state == "deferred"

    services.run_finalize(run_id=second.workflow_run_id, status="succeeded")
    drain_run(options=drain_options("generic", {}))  # `drain generic`, no options

    item.refresh_from_db()
    assert (item.status, item.route_scope) == ("admitted", "night")
    assert {t for _, t in accounts_of(item.workflow_run_id)} == {"codex"}
    assert InboxEvent.objects.get(work_item_id=first.id).state == "admitted"


def test_a_refused_retry_changes_nothing() -> None:
    item = route(event=generic_event()).work_item
    with pytest.raises(ApplicationError, match="not requeueable"):
        retry_work_item(item_id=item.id)
    item.refresh_from_db()
    assert item.status == "admitted" and item.attempts == 1
    with pytest.raises(ApplicationError, match="not found"):
        retry_work_item(item_id="nope")


def test_a_retry_whose_stored_route_no_longer_routes_rolls_back(settings) -> None:
    item = route(event=generic_event()).work_item
    fail(item)
    settings.LOOPSWEB_PROJECT_ROOTS = ("/nowhere-else",)
    with pytest.raises(ApplicationError):
        retry_work_item(item_id=item.id)
    item.refresh_from_db()
    assert (item.status, item.attempts) == ("failed", 1)  # the requeue rolled back too


def test_an_item_without_a_stored_route_is_requeued_for_the_next_drain() -> None:
    item = make_work_item(status="failed", attempts=1)
    assert item.route_options_json is None
    item = retry_work_item(item_id=item.id)
    assert item.status == "queued"
    assert "stores no route" in retry_outcome(item)


def test_routes_retry_and_cancel_commands(codex_pool) -> None:
    item = route(event=generic_event(), **ROUTE).work_item
    out = io.StringIO()
    call_command("routes", "cancel", item.id, "--reason", "wrong repo", stdout=out)
    item.refresh_from_db()
    assert item.status == "cancelled" and "cancelled" in out.getvalue()
    out = io.StringIO()
    call_command("routes", "retry", item.id, stdout=out)
    item.refresh_from_db()
    assert item.status == "admitted" and "admitted again" in out.getvalue()
    assert {t for _, t in accounts_of(item.workflow_run_id)} == {"codex"}
    with pytest.raises(CommandError, match="not requeueable"):
        call_command("routes", "retry", item.id, stdout=io.StringIO())
    with pytest.raises(CommandError, match="not found"):
        call_command("routes", "cancel", "nope", stdout=io.StringIO())
