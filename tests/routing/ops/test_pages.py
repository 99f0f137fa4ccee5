"""The /ops pages (issue 6): content, empty states, permissions and fixed query counts."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from ledger.models import WorkflowWorkItem
from ledger.services.run_workers import run_worker_report
from ledger.webkit import access
from routing.models import DrainRecord
from tests.factories import make_staff_user
from tests.routing.helpers import generic_event
from tests.routing.ops import seed as ops_seed

pytestmark = pytest.mark.django_db

LIST_PAGES = ["ops:overview", "ops:deferrals", "ops:accounts", "ops:drains"]
ALL_PAGES = [
    *((name, ()) for name in LIST_PAGES),
    ("ops:work-item", ("0" * 32,)),
    ("ops:drain", ("0" * 32,)),
]
# 21: the overview's notifications section reads the outbox in one query.
MAX_QUERIES = 21


def body(client, url: str, **query: str) -> str:
    response = client.get(url, query)
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


# --- permissions ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "args"), ALL_PAGES)
def test_anonymous_users_are_sent_to_the_admin_login(client, name, args) -> None:
    url = reverse(name, args=args)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('admin:login')}?next={url}"


@pytest.mark.parametrize(("name", "args"), ALL_PAGES)
def test_signed_in_users_who_are_not_staff_are_forbidden(
    client, django_user_model, name, args
) -> None:
    client.force_login(django_user_model.objects.create_user("visitor", password="pw"))
    assert client.get(reverse(name, args=args)).status_code == 403


def test_staff_need_the_work_items_view_permission(client) -> None:
    """The rest of the rule (each page's own permissions): test_permissions.py."""
    client.force_login(make_staff_user("ops"))
    assert client.get(reverse("ops:overview")).status_code == 403
    client.force_login(make_staff_user("viewer", access.ITEMS))
    assert client.get(reverse("ops:overview")).status_code == 200


def test_unknown_item_and_drain_ids_are_404(admin_client) -> None:
    assert admin_client.get(reverse("ops:work-item", args=["nope"])).status_code == 404
    assert admin_client.get(reverse("ops:drain", args=["nope"])).status_code == 404


def test_the_admin_index_links_every_ops_page(admin_client) -> None:
    html = body(admin_client, reverse("admin:index"))
    assert 'id="operations-module"' in html and ">Operations</a>" in html
    for name in LIST_PAGES:
        assert f'href="{reverse(name)}"' in html
    # The app list of the stock index is still there.
    assert reverse("admin:ledger_workflowworkitem_changelist") in html


def test_pages_use_the_admin_look(admin_client) -> None:
    html = body(admin_client, reverse("ops:overview"))
    assert "Django administration" in html  # admin/base_site.html's branding
    assert 'class="breadcrumbs"' in html and "Operations overview" in html
    assert "All times are UTC" in html


# --- empty states -----------------------------------------------------------------------------


def test_every_page_says_what_to_do_on_an_empty_ledger(admin_client) -> None:
    overview = body(admin_client, reverse("ops:overview"))
    assert "No drains yet" in overview
    assert "python manage.py drain generic" in overview
    assert "schedule_drain" in overview
    assert "No route scope has work or a cap yet" in overview
    assert "No account is cooling down" in overview
    assert "Nothing is waiting" in overview

    deferrals = body(admin_client, reverse("ops:deferrals"))
    assert "Nothing is deferred" in deferrals
    assert "No inbox event is deferred" in deferrals

    accounts = body(admin_client, reverse("ops:accounts"))
    assert "No account has run or reserved a step" in accounts
    assert "--auth-profile-pool" in accounts
    assert '<svg class="ops-chart' not in accounts

    drains = body(admin_client, reverse("ops:drains"))
    assert "No drains yet" in drains and "No scheduled drain" in drains


def test_an_item_that_never_waited_says_so(admin_client) -> None:
    item = ops_seed.deferred_items(0) or WorkflowWorkItem.objects.get()
    html = body(admin_client, reverse("ops:work-item", args=[item.id]))
    assert "This item was never deferred" in html


def test_a_drain_that_considered_nothing_says_what_to_do(admin_client) -> None:
    (report,) = ops_seed.drains(1)
    html = body(admin_client, reverse("ops:drain", args=[report.record_id]))
    assert "This drain considered no item" in html
    assert "ingest_events" in html


# --- overview ---------------------------------------------------------------------------------


def test_overview_shows_caps_load_cooldowns_deferrals_and_drains(admin_client) -> None:
    ops_seed.deferred_items(2)
    ops_seed.drains(1, inbox_events=3)
    ops_seed.account_history(1)
    call_command(
        "schedule_drain",
        "hourly",
        "generic",
        "--every",
        "5m",
        "--max-active",
        "4",
        stdout=io.StringIO(),
    )
    html = body(admin_client, reverse("ops:overview"))
    scopes = html.split('id="scopes"')[1].split("</section>")[0]
    # nightly-0's drain admitted one item under its cap of 1: full, cap read from the drain.
    assert "<code>nightly-0</code>" in scopes and "1 / 1" in scopes
    assert reverse("ops:drain", args=[DrainRecord.objects.get().id]) in scopes
    # A schedule names its scope's cap before anything ran there.
    assert "<code>hourly</code>" in scopes and "0 / 4" in scopes
    assert "schedule <code>hourly</code>" in scopes
    # Items routed directly (no drain, no schedule) have no known cap.
    assert f"<code>{ops_seed.SCOPE}</code>" in scopes and "no cap" in scopes

    groups = html.split('id="groups"')[1].split("</section>")[0]
    assert "<code>g0</code>" in groups and "0 / 3" in groups  # group cap from the drain

    accounts = html.split('id="accounts"')[1].split("</section>")[0]
    assert "<code>acct-00</code>" in accounts and "cooling until" in accounts
    # The drain's pool is known with its --max-per-profile, even for an idle member.
    assert "<code>pool-b0</code>" in accounts and "/ 2" in accounts

    cooldowns = html.split('id="cooldowns"')[1].split("</section>")[0]
    assert "acct-00" in cooldowns and "UTC" in cooldowns and "(in 29 min " in cooldowns

    deferrals = html.split('id="deferrals"')[1].split("</section>")[0]
    assert "Route scope limit (--max-active)" in deferrals

    inbox = html.split('id="inbox"')[1].split("</section>")[0]
    rows = re.findall(
        r'\?state=(\w+)">\w+</a></td>\s*<td class="num[^"]*">(\d+)<', inbox
    )
    assert rows == [("pending", "0"), ("deferred", "2"), ("failed", "0")]

    drains = html.split('id="drains"')[1].split("</section>")[0]
    assert "nightly-0" in drains and " ago)" in drains


# --- deferrals --------------------------------------------------------------------------------


def test_deferrals_are_grouped_by_reason_scope_and_project(admin_client) -> None:
    first, second = ops_seed.deferred_items(2)
    html = body(admin_client, reverse("ops:deferrals"))
    groups = html.split('id="groups"')[1].split("</section>")[0]
    assert groups.count("<tr>") == 1 + 2  # header + one group per project
    assert "<code>/srv/p0</code>" in groups and "<code>/srv/p1</code>" in groups
    assert "Route scope limit (--max-active)" in groups
    items = html.split('id="items"')[1].split("</section>")[0]
    assert reverse("ops:work-item", args=[first.id]) in items
    assert reverse("ops:work-item", args=[second.id]) in items

    filtered = body(admin_client, reverse("ops:deferrals"), project_key="/srv/p1")
    items = filtered.split('id="items"')[1].split("</section>")[0]
    assert reverse("ops:work-item", args=[second.id]) in items
    assert reverse("ops:work-item", args=[first.id]) not in items


def test_deferred_inbox_events_are_listed_with_their_reason(admin_client) -> None:
    ops_seed.drains(1, inbox_events=3)
    html = body(admin_client, reverse("ops:deferrals"))
    inbox = html.split('id="inbox"')[1].split("</section>")[0]
    assert "Route scope limit (--max-active)" in inbox
    assert inbox.count("held by pre-check") == 2


def test_an_items_history_shows_what_each_deferral_saw_yesterday(admin_client) -> None:
    now = timezone.now()
    envelope = generic_event(project="/srv/history", group="g-history")
    with time_machine.travel(now - timedelta(days=1), tick=False):
        ops_seed.deferred_items(0)  # the holder takes the only slot
        ops_seed.redefer(envelope, 1)
    ops_seed.redefer(envelope, 1)
    item = WorkflowWorkItem.objects.get(project_key="/srv/history")
    html = body(admin_client, reverse("ops:work-item", args=[item.id]))
    history = html.split('id="history"')[1].split("</section>")[0]
    assert history.count("<code>route_cap</code>") == 2
    yesterday = (now - timedelta(days=1)).strftime("%Y-%m-%d %H:%M")
    assert yesterday in history and "(24 h ago)" in history
    # The counts and limits read inside the deciding transaction, each time.
    assert history.count("route scope active: 1 / 1") == 2
    assert 'class="full"' in history
    assert "/srv/history" in history and "g-history" in history
    assert history.count("project active: 0 / no cap") == 2


# --- accounts ---------------------------------------------------------------------------------


def test_accounts_show_load_history_rate_limits_and_charts(admin_client) -> None:
    ops_seed.account_history(2)
    html = body(admin_client, reverse("ops:accounts"))
    table = html.split('id="table"')[1].split("</section>")[0]
    row = table.split('id="account-1"')[1].split("</tr>")[0]
    assert "<code>acct-00</code>" in row
    # running 1, reserved 1, no cap, 2 steps in 24 h and 7 d, 1 failed, 1 rate limit
    cells = [c.split("</td>")[0].strip() for c in row.split('<td class="num')[1:]]
    assert [c.split(">")[-1] for c in cells] == ["1", "1", "2", "2", "1", "1"]
    assert "cooling" in row and "(in 29 min " in row and "1 report:" in row
    breakdown = table.split('class="breakdown"')[1].split("</table>")[0]
    assert "<td>verifier</td><td>claude</td>" in breakdown
    assert "<td>worker</td><td>codewith</td>" in breakdown

    load = html.split('id="load"')[1].split("</section>")[0]
    assert '<svg class="ops-chart load-chart"' in load
    assert "acct-00: 1 running, 1 reserved, no cap, cooling down" in load
    timeline = html.split('id="timeline"')[1].split("</section>")[0]
    assert '<svg class="ops-chart timeline"' in timeline
    assert timeline.count("1 step started") == 4  # 2 accounts × (worker, verifier)
    # Server-rendered: nothing fetched from elsewhere; the two scripts of ours are the
    # auto-refresh timer and the sidebar's closed default (base_site), inline, no framework.
    assert 'src="http' not in html and html.count("<script>") == 2
    assert "loopsweb.ops.refreshPaused" in html


# --- drains -----------------------------------------------------------------------------------


def test_drains_list_their_counts_and_link_each_drain(admin_client) -> None:
    reports = ops_seed.drains(2, inbox_events=3)
    html = body(admin_client, reverse("ops:drains"))
    table = html.split('id="drains"')[1].split("</section>")[0]
    for report in reports:
        assert reverse("ops:drain", args=[report.record_id]) in table
    # newest first; nightly-0 considered 3 (1 created, 2 held by the pre-check)
    assert table.index("nightly-1") < table.index("nightly-0")
    row = table.split("<code>nightly-0</code>")[1].split("</tr>")[0]
    assert [c.split("<")[0] for c in row.split('<td class="num">')[1:7]] == [
        "3",
        "3",
        "1",
        "0",
        "2",
        "0",
    ]


def test_drains_are_paginated(admin_client) -> None:
    ops_seed.drains(51)
    first = body(admin_client, reverse("ops:drains"))
    assert "page 1 of 2" in first and "?page=2" in first
    second = body(admin_client, reverse("ops:drains"), page="2")
    assert second.split('id="drains"')[1].count("<code>nightly-0</code>") == 1
    assert "<code>nightly-50</code>" not in second.split('id="drains"')[1]


def test_a_drain_page_shows_each_items_result(admin_client) -> None:
    (report,) = ops_seed.drains(1, inbox_events=3)
    html = body(admin_client, reverse("ops:drain", args=[report.record_id]))
    results = html.split('id="results"')[1].split("</section>")[0]
    assert results.count('class="result-created"') == 1
    assert results.count('class="result-throttled"') == 2
    assert results.count("pre-check") == 2
    assert "Route scope limit (--max-active)" in results
    created = WorkflowWorkItem.objects.get(status="admitted", route_scope="nightly-0")
    assert reverse("ops:work-item", args=[created.id]) in results
    assert "admitted → admitted" in results
    assert "worker: <code>pool-" in results  # the pool account each role got
    summary = html.split('id="summary"')[1].split("</section>")[0]
    assert (
        "--max-active 1" in summary and "--auth-profile-pool pool-a0,pool-b0" in summary
    )


# --- query counts -----------------------------------------------------------------------------


def _count(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_query_counts_stay_the_same_from_2_to_30_rows(admin_client) -> None:
    """Every page and changelist: same count with 2 rows of everything and with 30."""
    history = generic_event(project="/srv/history")

    def urls(drain_id: str, item_id: str) -> dict[str, str]:
        return {
            **{name: reverse(name) for name in LIST_PAGES},
            "ops:work-item": reverse("ops:work-item", args=[item_id]),
            "ops:drain": reverse("ops:drain", args=[drain_id]),
            "deferrals filtered": f"{reverse('ops:deferrals')}?reason_code=route_cap",
            "admin work items": reverse("admin:ledger_workflowworkitem_changelist"),
            "admin runs": reverse("admin:ledger_workflowrun_changelist"),
            "admin step runs": reverse("admin:ledger_workflowsteprun_changelist"),
        }

    ops_seed.deferred_items(2)
    ops_seed.redefer(history, 2)
    small_drain = ops_seed.drains(2, inbox_events=2)[0]
    ops_seed.account_history(2)
    item = WorkflowWorkItem.objects.get(project_key="/srv/history")
    small = {
        k: _count(admin_client, u)
        for k, u in urls(small_drain.record_id, item.id).items()
    }

    ops_seed.deferred_items(28, start=2)
    ops_seed.redefer(history, 28)
    big_drain = ops_seed.drains(28, start=2, inbox_events=30)[0]
    ops_seed.account_history(28, start=2)
    assert item.deferrals.count() == 30 and len(big_drain.results) >= 30
    large = {
        k: _count(admin_client, u)
        for k, u in urls(big_drain.record_id, item.id).items()
    }

    assert large == small
    assert max(small.values()) <= MAX_QUERIES, small


@pytest.mark.parametrize("name", LIST_PAGES)
def test_each_page_renders_within_the_query_budget(
    admin_client, django_assert_max_num_queries, name
) -> None:
    ops_seed.deferred_items(3)
    ops_seed.drains(2, inbox_events=3)
    ops_seed.account_history(3)
    with django_assert_max_num_queries(MAX_QUERIES):
        assert admin_client.get(reverse(name)).status_code == 200


def test_the_overview_with_every_section_shown_stays_within_the_budget(
    admin_client,
) -> None:
    """Every section of /ops/ has something to show (deferrals, drains, accounts with
    history, a step waiting for a cooling account, a drain schedule that is overdue, run
    workers): the page still sends at most MAX_QUERIES, the same count as with more rows.
    (At 1M items the overview once sent 21: sections that only query when they have rows.)"""

    def seed(start: int, n: int) -> None:
        ops_seed.deferred_items(n, start=start)
        ops_seed.drains(n, start=start, inbox_events=n)
        ops_seed.account_history(n, start=start)
        for i in range(start, start + n):
            ops_seed.waiting_step(f"wait-{i}")
            run_worker_report(
                cluster="loopsweb-runs", host="m1", pid=100 + i, cluster_pid=1
            )
            call_command(
                "schedule_drain", f"late-{i}", "generic", "--every", "5m",
                "--max-active", "2", stdout=io.StringIO(),
            )  # fmt: skip
        Schedule.objects.filter(name__startswith="late-").update(
            next_run=timezone.now() - timedelta(minutes=10)
        )

    seed(0, 2)
    html = body(admin_client, reverse("ops:overview"))
    assert "Overdue schedules (2)" in html and "wait-0" in html
    small = _count(admin_client, reverse("ops:overview"))
    seed(2, 8)
    html = body(admin_client, reverse("ops:overview"))
    assert "Overdue schedules (10)" in html and "wait-9" in html
    assert "Schedule late-9 is overdue by 10 min" in html
    assert _count(admin_client, reverse("ops:overview")) == small <= MAX_QUERIES, small
