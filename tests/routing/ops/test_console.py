"""Operator console, second pass (issue 19): the audit trail, inbox actions, drain retention
and filters, schedule actions, the overview's live sections and the copy beside numbers, the
compact work-item list and the operator's item page."""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from ledger.models import (
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from ledger.services import run_finalize, step_start
from ledger.webkit import access
from routing.drains.inbox import inbox_ingest
from routing.drains.retention import drain_records_prune
from routing.models import DrainRecord, InboxEvent
from routing.tasks import prune_empty_drains
from tests.factories import make_run, make_staff_user, make_step_run, make_work_item
from tests.ledger.admin_actions import ITEMS, RUNS, admitted, messages_of, post_action
from tests.routing.helpers import generic_event, route, todos_event
from tests.routing.ops import seed as ops_seed

pytestmark = pytest.mark.django_db

INBOX = reverse("admin:routing_inboxevent_changelist")


def body(client, url: str, **params: str) -> str:
    response = client.get(url, params)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def section(html: str, id_: str) -> str:
    return html.split(f'id="{id_}"')[1].split("</section>")[0]


# --- audit trail ------------------------------------------------------------------------------


def test_every_operator_action_writes_a_log_entry_and_names_the_user(
    admin_client, admin_user
) -> None:
    (item,) = admitted(1)
    run_id = item.workflow_run_id
    post_action(
        admin_client,
        ITEMS,
        "cancel_items",
        [item.id],
        confirm="yes",
        reason="wrong repo",
    )
    post_action(
        admin_client,
        ITEMS,
        "requeue_items",
        [item.id],
        confirm="yes",
        reason="retry it",
    )
    item.refresh_from_db()
    assert item.status == "queued"

    entries = list(LogEntry.objects.order_by("action_time", "id"))
    assert [(e.user_id, e.object_id) for e in entries] == [(admin_user.pk, item.id)] * 2
    assert [e.get_change_message() for e in entries] == [
        "Cancel work items: wrong repo",
        "Requeue work items: retry it",
    ]
    # The run the item left names who cancelled and who requeued it, with the reasons.
    events = {
        e.event_type: e.payload_json
        for e in WorkflowEvent.objects.filter(workflow_run_id=run_id)
    }
    assert events["cancelled"] == {
        "reason": "wrong repo",
        "user": "admin",
        "error": "wrong repo",
    }
    assert events["operator_requeue"] == {"user": "admin", "reason": "retry it"}

    # The item page shows the history, newest first, even after the next run's reason.
    WorkflowWorkItem.objects.filter(pk=item.id).update(last_reason="admitted again")
    history = body(
        admin_client, reverse("admin:ledger_workflowworkitem_change", args=[item.id])
    )
    history = history.split('id="item-history"')[1]
    assert history.index("retry it") < history.index("wrong repo")
    assert "<td>admin</td>" in history


def test_a_run_retry_is_logged_on_the_run_and_shown_on_its_items_page(
    admin_client,
) -> None:
    (item,) = admitted(1)
    run_finalize(run_id=item.workflow_run_id, status="failed", error="boom")
    post_action(admin_client, RUNS, "retry_runs", [item.workflow_run_id], confirm="yes")
    entry = LogEntry.objects.get()
    assert entry.object_id == item.workflow_run_id
    assert WorkflowEvent.objects.filter(
        workflow_run_id=item.workflow_run_id, event_type="operator_retry"
    ).exists()
    html = body(
        admin_client, reverse("admin:ledger_workflowworkitem_change", args=[item.id])
    )
    assert "Retry workflow runs" in html.split('id="item-history"')[1]


def test_a_refused_action_writes_no_log_entry(admin_client) -> None:
    (item,) = admitted(1)  # admitted: not requeueable
    response = post_action(
        admin_client, ITEMS, "requeue_items", [item.id], confirm="yes", reason="x"
    )
    assert any("not requeued" in m for m in messages_of(response))
    assert LogEntry.objects.count() == 0


# --- inbox admin ------------------------------------------------------------------------------


def failed_event() -> InboxEvent:
    inbox_ingest(enumerate([generic_event()], start=1))
    row = InboxEvent.objects.get()
    InboxEvent.objects.filter(pk=row.pk).update(
        state="failed", last_reason="boom", routed_at=timezone.now()
    )
    return InboxEvent.objects.get(pk=row.pk)


def test_inbox_events_filter_by_state_and_search_by_event_id(admin_client) -> None:
    row = failed_event()
    inbox_ingest(enumerate([generic_event()], start=1))
    failed = body(admin_client, INBOX, state="failed")
    assert failed.count('class="action-select"') == 1 and row.id in failed
    found = body(admin_client, INBOX, q=row.event_id)
    assert found.count('class="action-select"') == 1
    page = body(admin_client, reverse("admin:routing_inboxevent_change", args=[row.pk]))
    assert row.event_id in page and "&quot;project_path&quot;" in page


def test_a_failed_event_is_retried_with_a_reason_and_the_next_drain_routes_it(
    admin_client,
) -> None:
    from routing.drains import drain_options, drain_run

    row = failed_event()
    confirm = post_action(admin_client, INBOX, "reopen_events", [row.pk])
    assert (
        "Retry (reopen) inbox events: 1 inbox event selected."
        in confirm.content.decode()
    )
    done = post_action(
        admin_client, INBOX, "reopen_events", [row.pk], confirm="yes", reason="fixed"
    )
    assert "Reopened 1 inbox event." in messages_of(done)
    row.refresh_from_db()
    assert row.state == "pending" and row.last_reason == "fixed (by admin)"
    assert (
        LogEntry.objects.get().get_change_message()
        == "Retry (reopen) inbox events: fixed"
    )
    report = drain_run(options=drain_options("generic", {}), env={})
    assert [r["kind"] for r in report.results] == ["created"]


def test_discard_settles_an_event_as_skipped_and_refuses_admitted_ones(
    admin_client,
) -> None:
    row = failed_event()
    blank = post_action(admin_client, INBOX, "discard_events", [row.pk], confirm="yes")
    assert "A reason is required" in blank.content.decode()
    post_action(
        admin_client, INBOX, "discard_events", [row.pk], confirm="yes", reason="spam"
    )
    row.refresh_from_db()
    assert row.state == "skipped" and row.last_reason == "spam (by admin)"
    again = post_action(
        admin_client, INBOX, "discard_events", [row.pk], confirm="yes", reason="spam"
    )
    assert any(
        "not discardable" in m and "state=skipped" in m for m in messages_of(again)
    )
    assert LogEntry.objects.count() == 1


def test_an_inbox_event_links_to_the_drain_that_last_recorded_it(admin_client) -> None:
    (report,) = ops_seed.drains(1, inbox_events=2)
    held = InboxEvent.objects.get(state="deferred")
    response = admin_client.get(reverse("ops:inbox-last-drain", args=[held.pk]))
    assert response.status_code == 302
    assert response["Location"] == reverse("ops:drain", args=[report.record_id])
    listing = body(admin_client, INBOX)
    assert reverse("ops:inbox-last-drain", args=[held.pk]) in listing


# --- drain records: filters, retention --------------------------------------------------------


def drain_record(*, days_ago: float, **counts: object) -> DrainRecord:
    return DrainRecord.objects.create(
        kind="generic",
        route_scope="s",
        started_at=timezone.now() - timedelta(days=days_ago),
        **counts,
    )


def test_empty_drain_records_older_than_the_retention_are_pruned() -> None:
    old_empty = drain_record(days_ago=8)
    old_held = drain_record(days_ago=8, held_reason="scope full")  # nothing considered
    old_busy = drain_record(days_ago=8, considered=3, created=1)
    old_error = drain_record(days_ago=8, error="source failed", fatal=1)
    new_empty = drain_record(days_ago=1)
    assert drain_records_prune(now=timezone.now(), days=7, dry_run=True) == 2
    assert DrainRecord.objects.count() == 5
    assert prune_empty_drains() == {"deleted": 2, "retentionDays": 7}
    left = set(DrainRecord.objects.values_list("pk", flat=True))
    assert left == {old_busy.pk, old_error.pk, new_empty.pk}
    assert old_empty.pk not in left and old_held.pk not in left
    assert prune_empty_drains()["deleted"] == 0  # a second delivery changes nothing


def test_prune_drains_command_previews_and_takes_days(settings) -> None:
    drain_record(days_ago=3)
    out = io.StringIO()
    call_command("prune_drains", "--days", "2", "--dry-run", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"deleted": 1, "days": 2, "dryRun": True}
    assert DrainRecord.objects.count() == 1
    settings.LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS = 5
    out = io.StringIO()
    call_command("prune_drains", stdout=out)
    assert "older than 5 days: deleted 0" in out.getvalue()
    call_command("prune_drains", "--days", "1", stdout=io.StringIO())
    assert DrainRecord.objects.count() == 0


def test_the_prune_schedule_is_built_in() -> None:
    call_command("sync_schedules", stdout=io.StringIO())
    schedule = Schedule.objects.get(name="prune-empty-drains")
    assert schedule.func == "routing.tasks.prune_empty_drains"
    assert schedule.minutes == 60


def test_drain_records_filter_by_what_they_did(admin_client) -> None:
    empty = drain_record(days_ago=0.1)
    busy = drain_record(days_ago=0.2, considered=2, created=2)
    error = drain_record(days_ago=0.3, error="boom")
    held = drain_record(days_ago=0.4, held_reason="scope full")

    def shown(show: str) -> set[str]:
        html = section(body(admin_client, reverse("ops:drains"), show=show), "drains")
        return {
            r.pk
            for r in (empty, busy, error, held)
            if reverse("ops:drain", args=[r.pk]) in html
        }

    assert shown("") == {empty.pk, busy.pk, error.pk, held.pk}
    assert shown("did") == {busy.pk}
    assert shown("error") == {error.pk}
    assert shown("held") == {held.pk}
    assert shown("empty") == {empty.pk, held.pk}


# --- schedule actions -------------------------------------------------------------------------


def test_a_schedule_is_paused_resumed_and_run_now_with_a_log_entry(
    admin_client,
) -> None:
    call_command(
        "schedule_drain", "hourly", "generic", "--every", "60m", stdout=io.StringIO()
    )
    schedule = Schedule.objects.get(name="hourly")
    url = reverse("ops:schedule-action", args=[schedule.pk, "pause"])
    assert admin_client.get(url).status_code == 405  # POST only
    admin_client.post(url)
    schedule.refresh_from_db()
    assert schedule.repeats == 0
    html = section(body(admin_client, reverse("ops:drains")), "schedules")
    assert "paused" in html and "Resume" in html

    refused = admin_client.post(
        reverse("ops:schedule-action", args=[schedule.pk, "run"]), follow=True
    )
    assert any("is paused" in m for m in messages_of(refused))

    admin_client.post(reverse("ops:schedule-action", args=[schedule.pk, "resume"]))
    schedule.refresh_from_db()
    assert schedule.repeats == -1
    before = timezone.now()
    admin_client.post(reverse("ops:schedule-action", args=[schedule.pk, "run"]))
    schedule.refresh_from_db()
    assert schedule.next_run is not None and schedule.next_run >= before
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == [
        "pause (ops drains page)",
        "resume (ops drains page)",
        "run (ops drains page)",
    ]
    assert (
        admin_client.post(
            reverse("ops:schedule-action", args=[schedule.pk, "explode"])
        ).status_code
        == 404
    )


def test_schedule_actions_need_the_change_schedule_permission(
    client, django_user_model
) -> None:
    call_command(
        "schedule_drain", "h", "generic", "--every", "5m", stdout=io.StringIO()
    )
    schedule = Schedule.objects.get(name="h")
    viewer = make_staff_user("viewer", access.ITEMS, access.DRAINS, access.SCHEDULES)
    client.force_login(viewer)
    assert "Pause" not in section(body(client, reverse("ops:drains")), "schedules")
    response = client.post(reverse("ops:schedule-action", args=[schedule.pk, "pause"]))
    assert response.status_code == 403
    schedule.refresh_from_db()
    assert schedule.repeats == -1


# --- overview: running now, waiting for an account, inbox, copy ------------------------------


def test_the_overview_shows_what_runs_now_and_what_waits_for_an_account(
    admin_client,
) -> None:
    ops_seed.account_history(1)  # acct-00 runs a worker step
    waiting = ops_seed.waiting_step("acct-00")
    html = body(admin_client, reverse("ops:overview"))
    running = section(html, "running")
    assert "Running now (1)" in running and "worker" in running and "acct-00" in running
    # elapsed, e.g. "5 min" (ledger.display.duration_text)
    assert re.search(r">\d+ min( \d+ s)?<", running)
    waits = section(html, "waiting")
    assert "Waiting for an account (1)" in waits
    assert waiting.step_id in waits and "cooldown" in waits and "acct-00" in waits


def test_the_overview_never_says_nothing_waits_beside_deferred_inbox_events(
    admin_client,
) -> None:
    ops_seed.drains(1, inbox_events=3)  # one admitted, two inbox events held
    WorkflowWorkItem.objects.update(status="succeeded")
    html = body(admin_client, reverse("ops:overview"))
    deferrals = section(html, "deferrals")
    assert "Nothing is waiting" not in deferrals
    assert "2 inbox events held by a drain" in deferrals

    InboxEvent.objects.update(state="skipped")
    calm = section(body(admin_client, reverse("ops:overview")), "deferrals")
    assert "Nothing is waiting" in calm


def test_hints_name_the_route_kind_this_installation_drains(admin_client) -> None:
    from routing.drains import drain_options, drain_run

    inbox_ingest(enumerate([todos_event()], start=1))
    drain_run(options=drain_options("todos-task", {}), env={})
    InboxEvent.objects.update(state="pending")  # not routed yet: the hint says how
    html = body(admin_client, reverse("ops:overview"))
    assert "drain todos-task" in html and "drain generic" not in html


def test_the_overview_counts_failed_inbox_events_and_overdue_schedules(
    admin_client,
) -> None:
    failed_event()
    call_command(
        "schedule_drain", "late", "generic", "--every", "5m", stdout=io.StringIO()
    )
    Schedule.objects.filter(name="late").update(
        next_run=timezone.now() - timedelta(minutes=10)
    )
    html = body(admin_client, reverse("ops:overview"))
    inbox = section(html, "inbox")
    assert "1 event failed" in inbox and "?state=failed" in inbox
    assert "Overdue schedules (1)" in inbox and "<code>late</code>" in inbox


def test_the_throughput_chart_counts_runs_finished_per_hour(admin_client) -> None:
    now = timezone.now()
    for status in ("succeeded", "succeeded", "failed"):
        make_run(status=status, finished_at=now - timedelta(minutes=5))
    make_run(status="succeeded", finished_at=now - timedelta(hours=30))  # outside
    html = section(body(admin_client, reverse("ops:overview")), "throughput")
    assert '<svg class="ops-chart throughput"' in html
    assert "2 succeeded, 1 failed</title>" in html
    assert "succeeded (2)" in html and "failed or timed out (1)" in html


# --- the work-item list and page -------------------------------------------------------------


def test_the_work_item_list_shows_the_operators_columns(admin_client) -> None:
    result = route(
        "todos-task",
        event=todos_event("T-1", title="Fix the login page"),
        auth_profile_pool="acct-a,acct-b",
    )
    item = result.work_item
    html = body(admin_client, ITEMS)
    row = html.split(f'title="{item.id}"')[1].split("</tr>")[0]
    assert f"…{item.id[-8:]}" in row and "Fix the login page" in row
    assert 'class="lw-status lw-live">admitted' in row
    assert "acct-a" in row and "acct-b" in row
    header = html.split("<thead>")[1].split("</thead>")[0]
    for column in (
        "title / subject",
        "status",
        "project",
        "accounts",
        "age",
        "duration",
    ):
        assert column in header.lower()
    assert (
        admin_client.get(ITEMS, {"q": item.id})
        .content.decode()
        .count('class="action-select"')
        == 1
    )


def test_the_work_item_list_reads_accounts_for_the_page_in_one_query(
    admin_client, django_assert_max_num_queries
) -> None:
    def listed(response, projects: list[str]) -> None:
        assert response.status_code == 200, response.status_code
        html = response.content.decode()
        assert html.count('class="action-select"') == len(projects), html
        titles = re.findall(
            r'<td class="field-project_cell"><span title="([^"]+)">', html
        )
        assert sorted(titles) == sorted(projects)
        # The accounts the one query read: the pool's on each admitted item's row (the
        # pool's caps defer the rest, which hold no account).
        accounts = re.findall(r'<td class="field-accounts_cell">([^<]*)</td>', html)
        admitted = WorkflowWorkItem.objects.filter(status="admitted").count()
        assert admitted >= 1 and len(accounts) == len(projects), accounts
        shown = [set(cell.split(", ")) for cell in accounts if cell != "-"]
        assert shown == [{"x", "y"}] * admitted, accounts

    for i in range(3):
        route(event=generic_event(project=f"/srv/p{i}"), auth_profile_pool="x,y")
    with django_assert_max_num_queries(12) as few:
        response = admin_client.get(ITEMS)
    listed(response, [f"/srv/p{i}" for i in range(3)])
    for i in range(12):
        route(event=generic_event(project=f"/srv/q{i}"), auth_profile_pool="x,y")
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = admin_client.get(ITEMS)
    listed(
        response, [f"/srv/{p}{i}" for p, n in (("p", 3), ("q", 12)) for i in range(n)]
    )


def test_the_item_page_is_an_operators_page(admin_client) -> None:
    result = route(
        "todos-task",
        event=todos_event("T-9", title="Ship it", description="Make the build green"),
        auth_profile_pool="acct-a,acct-b",
    )
    item = result.work_item
    run = WorkflowRun.objects.get(pk=item.workflow_run_id)
    first = run.step_runs.order_by("sequence").first()
    WorkflowRun.objects.filter(pk=run.pk).update(status="running", claimed_by="w")
    type(first).objects.filter(pk=first.pk).update(
        status="succeeded",
        exit_code=0,
        duration_ms=12_345,
        stdout="line 1\nall tests passed\n",
        started_at=timezone.now(),
    )
    run_finalize(run_id=run.pk, status="succeeded")
    html = body(
        admin_client, reverse("admin:ledger_workflowworkitem_change", args=[item.id])
    )
    assert f"Work item …{item.id[-8:]}: Ship it" in html
    assert "Make the build green" in html
    # every relation once, and the state sentence describes the finished run
    assert "todos-task:todos-task" not in html.split("</title>")[0]
    raw_fields = re.findall(
        r"field-(?:invocation|workflow|loop|workflow_run)(?![\w])", html
    )
    assert raw_fields == []  # the relations appear once each, as links
    assert (
        html.count('class="readonly"><a href="/admin/ledger/workflowinvocation/') == 1
    )
    assert (
        "succeeded: run …" in html
        and "admitted by" not in html.split("field-state_text")[1].split("</div>")[0]
    )
    runs = html.split('id="item-runs"')[1].split('id="item-deferrals"')[0]
    assert "12.3 s" in runs and "all tests passed" in runs and "acct-" in runs
    assert 'id="item-inbox"' in html and 'id="item-history"' in html
    # finished: requeue and dead-letter are offered, cancel is not
    actions = html.split('id="item-actions"')[1].split("</div>")[0]
    assert 'value="requeue_items"' in actions and 'value="dead_letter_items"' in actions
    assert 'value="cancel_items"' not in actions


def test_the_item_page_buttons_open_the_confirmation_page(admin_client) -> None:
    (item,) = admitted(1)
    response = admin_client.post(
        ITEMS, {"action": "cancel_items", "_selected_action": [item.id]}
    )
    assert (
        "Cancel work items: 1 workflow work item selected." in response.content.decode()
    )


def test_a_step_waiting_is_read_from_its_event(admin_client) -> None:
    step = ops_seed.waiting_step("acct-w")
    assert step.status == StepStatus.PENDING
    event = WorkflowEvent.objects.get(
        workflow_run_id=step.workflow_run_id, event_type="step_waiting"
    )
    assert event.payload_json["code"] == "cooldown"


def test_step_start_waits_and_the_overview_lists_it(admin_client) -> None:
    # the real path: step_start refuses a cooling account and writes step_waiting
    item = make_work_item(status="running")
    run = make_run(
        work_item=item, invocation=item.invocation, status="running", claimed_by="w"
    )
    step = make_step_run(
        workflow_run=run,
        step_id="worker",
        account_profile="acct-c",
        account_tool="codewith",
    )
    from ledger.services import account_cooldown_record

    account_cooldown_record(
        profile="acct-c",
        tool="codewith",
        until=timezone.now() + timedelta(minutes=10),
        reason="429",
        now=timezone.now(),
    )
    assert step_start(step_run_id=step.pk, worker="w").started is False
    waits = section(body(admin_client, reverse("ops:overview")), "waiting")
    assert "acct-c" in waits and "worker" in waits


def test_loop_actions_are_logged_too(admin_client) -> None:
    (item,) = admitted(1)
    url = reverse("admin:ledger_loop_changelist")
    post_action(admin_client, url, "pause_loops", [item.loop_id], confirm="yes")
    entry = LogEntry.objects.get()
    assert (
        entry.object_id == item.loop_id and entry.get_change_message() == "Pause loops"
    )


def test_the_overview_shows_how_long_ago_each_running_agent_made_progress(
    admin_client,
) -> None:
    ops_seed.account_history(1)  # acct-00 runs a worker step
    step = WorkflowStepRun.objects.get(status=StepStatus.RUNNING)
    # A CLI whose output tells progress apart, no progress yet; then 3 minutes ago.
    WorkflowStepRun.objects.filter(pk=step.pk).update(account_tool="codex")
    running = section(body(admin_client, reverse("ops:overview")), "running")
    assert "none yet" in running
    WorkflowStepRun.objects.filter(pk=step.pk).update(
        progress_at=timezone.now() - timedelta(minutes=3, seconds=5)
    )
    running = section(body(admin_client, reverse("ops:overview")), "running")
    assert "3 min 5 s ago" in running or "3 min 6 s ago" in running, running
    # Another CLI: any output is progress, so the column says nothing.
    WorkflowStepRun.objects.filter(pk=step.pk).update(account_tool="codewith")
    running = section(body(admin_client, reverse("ops:overview")), "running")
    assert "ago" not in running and "none yet" not in running
