"""The ledger admin as operator console (issue 6): lifecycle actions, filters, search, links."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.admin import actions as ledger_admin
from ledger.models import WorkflowRun, WorkflowWorkItem
from ledger.services import run_finalize, work_item_cancel
from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from tests.factories import make_run, make_step_run, make_work_item
from tests.ledger.admin_actions import ITEMS, RUNS, admitted, messages_of, post_action
from tests.routing.helpers import generic_event
from tests.routing.ops import seed as ops_seed

pytestmark = pytest.mark.django_db


def cancelled(n: int) -> list[WorkflowWorkItem]:
    items = admitted(n)
    for item in items:
        work_item_cancel(item_id=item.id, reason="stop")
    return items


def statuses(items: list[WorkflowWorkItem]) -> list[str]:
    return [WorkflowWorkItem.objects.get(pk=i.pk).status for i in items]


# --- requeue ----------------------------------------------------------------------------------


def test_requeue_confirms_with_the_count_and_requires_a_reason(admin_client) -> None:
    items = cancelled(2)
    ids = [i.id for i in items]
    page = post_action(admin_client, ITEMS, "requeue_items", ids)
    html = page.content.decode()
    assert "Requeue work items: 2 workflow work items selected." in html
    assert 'name="reason"' in html and "routes requeue" in html
    assert statuses(items) == [
        "cancelled",
        "cancelled",
    ]  # nothing happens before confirming

    blank = post_action(
        admin_client, ITEMS, "requeue_items", ids, confirm="yes", reason="  "
    )
    assert "A reason is required" in blank.content.decode()
    assert statuses(items) == ["cancelled", "cancelled"]

    done = post_action(
        admin_client, ITEMS, "requeue_items", ids, confirm="yes", reason="flaky CI"
    )
    assert done.redirect_chain and done.redirect_chain[-1][0].startswith(ITEMS)
    assert messages_of(done) == ["Requeued 2 workflow work items."]
    for item in WorkflowWorkItem.objects.filter(pk__in=ids):
        assert (item.status, item.last_reason, item.workflow_run_id) == (
            "queued",
            "flaky CI",
            None,
        )


def test_requeue_reports_the_items_it_refused(admin_client) -> None:
    (done,) = cancelled(1)
    (waiting,) = ops_seed.deferred_items(1)
    response = post_action(
        admin_client,
        ITEMS,
        "requeue_items",
        [done.id, waiting.id],
        confirm="yes",
        reason="again",
    )
    assert messages_of(response) == [
        "Requeued 1 workflow work item.",
        f"1 not requeued: workflow work item is not requeueable: {waiting.id} status=deferred",
    ]
    assert statuses([done, waiting]) == ["queued", "deferred"]


def test_requeue_reopens_the_inbox_event_for_the_next_drain(admin_client) -> None:
    inbox_ingest(enumerate([generic_event(project="/srv/inbox")], start=1))
    drain_run(options=drain_options("generic", {}), env={})
    item = WorkflowWorkItem.objects.get()
    work_item_cancel(item_id=item.id, reason="operator stop")
    post_action(
        admin_client, ITEMS, "requeue_items", [item.id], confirm="yes", reason="retry"
    )
    assert InboxEvent.objects.get().state == "pending"
    report = drain_run(options=drain_options("generic", {}), env={})
    assert report.counts["created"] == 1
    assert WorkflowWorkItem.objects.get().status == "admitted"


# --- cancel and dead-letter -------------------------------------------------------------------


def test_cancel_cancels_waiting_items_and_the_run_of_an_admitted_one(
    admin_client,
) -> None:
    waiting = ops_seed.deferred_items(2)
    holder = WorkflowWorkItem.objects.get(status="admitted")
    page = post_action(
        admin_client, ITEMS, "cancel_items", [holder.id, *(i.id for i in waiting)]
    )
    assert "Cancel work items: 3 workflow work items selected." in page.content.decode()
    assert "cancelled by operator" in page.content.decode()  # the suggested reason
    response = post_action(
        admin_client,
        ITEMS,
        "cancel_items",
        [holder.id, *(i.id for i in waiting)],
        confirm="yes",
        reason="cancelled by operator",
    )
    assert messages_of(response) == ["Cancelled 3 workflow work items."]
    assert statuses([holder, *waiting]) == ["cancelled"] * 3
    assert WorkflowRun.objects.get(work_item_id=holder.id).status == "cancelled"


def test_dead_letter_parks_waiting_items_and_refuses_active_ones(admin_client) -> None:
    (waiting,) = ops_seed.deferred_items(1)
    holder = WorkflowWorkItem.objects.get(status="admitted")
    response = post_action(
        admin_client,
        ITEMS,
        "dead_letter_items",
        [waiting.id, holder.id],
        confirm="yes",
        reason="poison event",
    )
    assert messages_of(response)[0] == "Dead-lettered 1 workflow work item."
    assert "not dead-letterable" in messages_of(response)[1]
    waiting.refresh_from_db()
    assert (waiting.status, waiting.last_reason) == ("dead_letter", "poison event")
    assert statuses([holder]) == ["admitted"]


# --- runs -------------------------------------------------------------------------------------


def test_retry_readmits_the_item_of_a_failed_run(admin_client) -> None:
    failed, running = admitted(2)
    run_finalize(run_id=failed.workflow_run_id, status="failed", error="exit 1")
    assert statuses([failed]) == ["failed"]
    ids = [failed.workflow_run_id, running.workflow_run_id]
    page = post_action(admin_client, RUNS, "retry_runs", ids)
    html = page.content.decode()
    assert "Retry workflow runs: 2 workflow runs selected." in html
    assert "Optional." in html  # retry needs no reason
    response = post_action(
        admin_client, RUNS, "retry_runs", ids, confirm="yes", reason=""
    )
    assert messages_of(response) == [
        "Retried 1 workflow run.",
        f"1 not retried: workflow run is not retryable: {running.workflow_run_id} status=queued",
    ]
    failed.refresh_from_db()
    # Re-admitted at once with the route it stores: a new run, attempt 2.
    assert (failed.status, failed.attempts) == ("admitted", 2)
    assert failed.workflow_run_id != ids[0]
    assert failed.last_reason.startswith(f"retry of workflow run {ids[0]}")


def test_cancel_runs_cancels_the_run_and_its_item(admin_client) -> None:
    (item,) = admitted(1)
    response = post_action(
        admin_client,
        RUNS,
        "cancel_runs",
        [item.workflow_run_id],
        confirm="yes",
        reason="wrong repo",
    )
    assert messages_of(response) == ["Cancelled 1 workflow run."]
    assert WorkflowRun.objects.get(pk=item.workflow_run_id).status == "cancelled"
    assert statuses([item]) == ["cancelled"]


# --- who may act, and how much ----------------------------------------------------------------


def test_staff_who_may_only_view_get_no_actions(client, django_user_model) -> None:
    (item,) = cancelled(1)
    viewer = django_user_model.objects.create_user(
        "viewer", password="pw", is_staff=True
    )
    viewer.user_permissions.add(
        Permission.objects.get(codename="view_workflowworkitem")
    )
    client.force_login(viewer)
    html = client.get(ITEMS).content.decode()
    assert item.id in html and "requeue_items" not in html
    post_action(client, ITEMS, "requeue_items", [item.id], confirm="yes", reason="x")
    assert statuses([item]) == ["cancelled"]


def test_an_action_over_too_many_rows_is_refused(admin_client, monkeypatch) -> None:
    monkeypatch.setattr(ledger_admin, "MAX_ACTION_ROWS", 1)
    items = cancelled(2)
    response = post_action(
        admin_client,
        ITEMS,
        "requeue_items",
        [i.id for i in items],
        confirm="yes",
        reason="bulk",
    )
    assert messages_of(response) == [
        "Select at most 1 workflow work items per action (narrow the list with the filters)."
    ]
    assert statuses(items) == ["cancelled", "cancelled"]


# --- filters, search, links -------------------------------------------------------------------


def test_work_items_filter_by_every_dimension(admin_client) -> None:
    now = timezone.now()
    with time_machine.travel(now - timedelta(days=8), tick=False):
        old = make_work_item(
            route_key="todos-task",
            route_scope="scope-old",
            project_key="/srv/old",
            project_group="g-old",
            status="failed",
        )
    new = make_work_item(
        route_scope="scope-new",
        project_key="/srv/new",
        project_group="g-new",
        status="deferred",
        reason_code="group_cap",
    )
    run = make_run(work_item=old, invocation=old.invocation)
    make_step_run(
        workflow_run=run,
        step_id="worker",
        account_profile="acct-x",
        account_tool="claude",
    )
    cases = [
        ({"status": "failed"}, old, new),
        ({"route_scope": "scope-new"}, new, old),
        ({"project_key": "/srv/old"}, old, new),
        ({"project_group": "g-new"}, new, old),
        ({"reason_code": "group_cap"}, new, old),
        ({"account_profile": "acct-x"}, old, new),
        ({"provider": "claude"}, old, new),
        ({"age": "1h"}, new, old),
        ({"age": "older"}, old, new),
        ({"route_key": "todos-task"}, old, new),
    ]
    for query, shown, hidden in cases:
        html = admin_client.get(ITEMS, query).content.decode()
        assert shown.id in html and hidden.id not in html, query
    # Choices come from the data (loose index scans), so operators can click them.
    sidebar = admin_client.get(ITEMS).content.decode()
    for choice in (
        "?route_scope=scope-old",
        "?project_key=%2Fsrv%2Fnew",
        "?project_group=g-new",
    ):
        assert choice in sidebar, choice


def test_work_items_search_by_id_subject_and_idempotency_key(admin_client) -> None:
    a = make_work_item(
        subject_ref="fix-login-bug", idempotency_key="generic-event:ci:one"
    )
    b = make_work_item(subject_ref="other", idempotency_key="generic-event:ci:two")
    for term, shown, hidden in [
        (a.id, a, b),
        ("login-bug", a, b),
        ("ci:two", b, a),
    ]:
        html = admin_client.get(ITEMS, {"q": term}).content.decode()
        assert shown.id in html and hidden.id not in html, term


def test_related_rows_link_item_invocation_run_and_step_runs(admin_client) -> None:
    (item,) = admitted(1)
    other = admitted(1)[0]
    run = WorkflowRun.objects.get(pk=item.workflow_run_id)
    page = admin_client.get(
        reverse("admin:ledger_workflowworkitem_change", args=[item.id])
    ).content.decode()
    assert (
        reverse("admin:ledger_workflowinvocation_change", args=[item.invocation_id])
        in page
    )
    assert reverse("admin:ledger_workflowrun_change", args=[run.id]) in page
    assert f"{RUNS}?work_item={item.id}" in page
    assert reverse("ops:work-item", args=[item.id]) in page

    runs = admin_client.get(RUNS, {"work_item": item.id}).content.decode()
    assert run.id in runs and other.workflow_run_id not in runs

    run_page = admin_client.get(
        reverse("admin:ledger_workflowrun_change", args=[run.id])
    ).content.decode()
    assert reverse("admin:ledger_workflowworkitem_change", args=[item.id]) in run_page
    for step in run.step_runs.all():  # the inline links every step run
        assert (
            reverse("admin:ledger_workflowsteprun_change", args=[step.id]) in run_page
        )

    invocation = admin_client.get(
        reverse("admin:ledger_workflowinvocation_change", args=[item.invocation_id])
    ).content.decode()
    assert f"{ITEMS}?invocation={item.invocation_id}" in invocation


def test_changelists_never_count_the_whole_table(admin_client) -> None:
    admitted(2)
    for name in ("workflowworkitem", "workflowrun", "workflowsteprun", "workflowevent"):
        with CaptureQueriesContext(connection) as ctx:
            response = admin_client.get(reverse(f"admin:ledger_{name}_changelist"))
        assert response.status_code == 200
        counts = [
            q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()
        ]
        assert counts, name
        assert all("LIMIT" in sql.upper() for sql in counts), counts
