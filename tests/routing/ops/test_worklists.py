"""/ops/attention/ and /ops/delivered/: what failed and why, what was
delivered; their filters, pages, query counts, and the overview's links to them."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import WorkflowWorkItem
from tests.routing import worklists_seed as seed

pytestmark = pytest.mark.django_db

ATTENTION = "/ops/attention/"
DELIVERED = "/ops/delivered/"


def page(client, url: str, status: int = 200, **query: str) -> str:
    response = client.get(url, query)
    assert response.status_code == status, response.content[:2000]
    return response.content.decode()


def rows_of(html: str, table: str) -> list[str]:
    section = html.split(f'id="{table}"')[1].split("</section>")[0]
    return re.findall(r"<tr id=\"[^\"]+\">.*?</tr>", section, re.S)


def row_of(html: str, item: WorkflowWorkItem) -> str:
    found = re.search(rf'<tr id="item-{item.id}">.*?</tr>', html, re.S)
    assert found, f"no row for {item.id}"
    return found.group(0)


# --- the attention list -----------------------------------------------------------------------


def test_attention_lists_each_item_that_failed_timed_out_or_was_not_delivered(
    admin_client,
) -> None:
    items = seed.seed_attention()
    html = page(admin_client, ATTENTION)
    assert len(rows_of(html, "attention")) == 3

    failed = row_of(html, items["failed"])
    assert f'href="/ops/items/{items["failed"].id}/"' in failed
    # The title is the task's, as text: never markup.
    assert (
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; Fix &lt;b&gt;login" in failed
    )
    assert "<script>alert" not in html
    assert ">failed</span>" in failed and "worker exited 1: tests fail" in failed
    assert "step <code>worker</code> failed (login failed)" in failed
    # Both accounts the step ran on (it moved after a rate limit), in order; both attempts'
    # tokens and cost.
    assert "<code>acct-a</code>, <code>acct-b</code>" in failed
    assert "2,000 in / 200 out, $0.5000" in failed

    timed_out = row_of(html, items["timed_out"])
    assert ">timed out</span>" in timed_out and "timed out after 3600 s" in timed_out
    undelivered = row_of(html, items["not_delivered"])
    assert ">not delivered</span>" in undelivered and seed.REFUSED in undelivered

    for kept_off in ("succeeded", "cancelled", "dead_letter", "running"):
        assert f"item-{items[kept_off].id}" not in html, kept_off
    kinds = html.split('id="kinds"')[1].split("</p>")[0]
    assert "failed (1)" in kinds and "timed out (1)" in kinds
    assert "not delivered (1)" in kinds


def test_a_dead_lettered_item_is_its_own_kind_with_its_reason(admin_client) -> None:
    """An item the re-dispatch bound set aside is listed as dead-lettered (never as failed,
    though its last run failed), with the bound's reason; one an operator dead-lettered
    (seed_attention's `dead_letter`: no reason code) is not listed."""
    items = seed.seed_attention()
    dead = seed.dead_lettered_item(project="/srv/jobs")
    html = page(admin_client, ATTENTION)
    assert len(rows_of(html, "attention")) == 4
    row = row_of(html, dead)
    assert ">dead-lettered</span>" in row and ">failed</span>" not in row
    assert "re-dispatched 8 times: dead-lettered (step worker failed" in row
    assert "step <code>worker</code> failed" in row
    assert f"item-{items['dead_letter'].id}" not in html
    kinds = html.split('id="kinds"')[1].split("</p>")[0]
    assert "failed (1)" in kinds and "dead-lettered (1)" in kinds
    assert '<option value="dead_lettered">dead-lettered</option>' in html

    only = page(admin_client, ATTENTION, kind="dead_lettered")
    assert [row_of(only, dead)] == rows_of(only, "attention")
    assert f"item-{dead.id}" not in page(admin_client, ATTENTION, kind="failed")
    assert f"item-{dead.id}" in page(admin_client, ATTENTION, project="/srv/jobs")
    # An operator's retry or requeue admits it again (the reason code cleared): off the list.
    WorkflowWorkItem.objects.filter(pk=dead.pk).update(
        status="queued", reason_code=None
    )
    assert f"item-{dead.id}" not in page(admin_client, ATTENTION)


def test_an_item_retried_leaves_the_list(admin_client) -> None:
    item = seed.seed_attention()["failed"]
    WorkflowWorkItem.objects.filter(pk=item.pk).update(status="queued")
    assert f"item-{item.id}" not in page(admin_client, ATTENTION)


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ({"kind": "failed"}, {"failed"}),
        ({"kind": "timed_out"}, {"timed_out"}),
        ({"kind": "not_delivered"}, {"not_delivered"}),
        ({"project": "/srv/api"}, {"timed_out"}),
        ({"route_scope": "nightly"}, {"failed", "not_delivered"}),
        ({"since": "24h"}, {"failed", "not_delivered"}),
        ({"since": "3d", "kind": "timed_out"}, {"timed_out"}),
    ],
)
def test_attention_filters(admin_client, query, shown) -> None:
    items = seed.seed_attention()
    two_days_ago = timezone.now() - timedelta(days=2)
    WorkflowWorkItem.objects.filter(pk=items["timed_out"].pk).update(
        updated_at=two_days_ago
    )
    html = page(admin_client, ATTENTION, **query)
    listed = {
        kind
        for kind in ("failed", "timed_out", "not_delivered")
        if f'id="item-{items[kind].id}"' in html
    }
    assert listed == shown


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"kind": "exploded"}, "kind: Select a valid choice"),
        ({"since": "yesterday"}, "since must be a duration back from now"),
        ({"since": "99999d"}, "since must be a duration back from now"),
        ({"since": "2030-01-01"}, "since must be a duration back from now"),
    ],
)
def test_a_bad_filter_is_a_400_that_says_why_and_lists_nothing(
    admin_client, query, message
) -> None:
    seed.seed_attention()
    html = page(admin_client, ATTENTION, status=400, **query)
    error = html.split('id="filter-error"')[1].split("</p>")[0]
    assert message in error
    assert 'id="item-' not in html


def test_the_attention_list_pages_with_its_filters(admin_client) -> None:
    for n in range(52):
        seed.item_with_run(
            title=f"broken {n}", item_status="failed", run_status="failed"
        )
    first = page(admin_client, ATTENTION, kind="failed")
    assert len(rows_of(first, "attention")) == 50
    assert "page 1 of 2" in first and "kind=failed&amp;page=2" in first
    second = page(admin_client, ATTENTION, kind="failed", page="2")
    assert len(rows_of(second, "attention")) == 2


# --- the delivered list -----------------------------------------------------------------------


def test_delivered_lists_pull_requests_and_pushed_branches(admin_client) -> None:
    runs = seed.seed_delivered()
    html = page(admin_client, DELIVERED)
    assert len(rows_of(html, "delivered")) == 3
    opened = html.split(f'id="run-{runs["open"].id}"')[1].split("</tr>")[0]
    assert 'href="https://github.com/acme/web/pull/12"' in opened
    assert "acme/web#12" in opened and ">open</span>" in opened
    assert "<code>loopsweb/run-12</code> at <code>0123456789ab</code>" in opened
    assert "&lt;script&gt;" in opened and "<script>alert" not in html
    assert f'href="/ops/items/{runs["open"].work_item_id}/"' in opened
    assert "<code>acct-a</code>, <code>acct-b</code>" in opened and "$0.5000" in opened
    # A pull request address that is not http(s) is shown, never a link.
    merged = html.split(f'id="run-{runs["merged"].id}"')[1].split("</tr>")[0]
    assert ">merged</span>" in merged and "javascript:" not in merged
    pushed = html.split(f'id="run-{runs["pushed"].id}"')[1].split("</tr>")[0]
    assert ">pushed</span>" in pushed and "<code>loopsweb/run-pushed</code>" in pushed
    for kept_off in ("refused", "kept"):
        assert f"run-{runs[kept_off].id}" not in html


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ({"state": "open"}, {"open"}),
        ({"state": "merged"}, {"merged"}),
        ({"state": "pushed"}, {"pushed"}),
        ({"state": "closed"}, set()),
        ({"project": "/srv/api"}, {"merged"}),
        ({"since": "7d"}, {"open", "merged", "pushed"}),
    ],
)
def test_delivered_filters(admin_client, query, shown) -> None:
    runs = seed.seed_delivered()
    html = page(admin_client, DELIVERED, **query)
    assert {k for k in ("open", "merged", "pushed") if runs[k].id in html} == shown


# --- queries, the overview, the navigation ----------------------------------------------------


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_each_list_costs_the_same_queries_for_2_rows_as_for_12(admin_client) -> None:
    def more(n: int) -> None:
        for i in range(n):
            seed.item_with_run(title=f"f{i}", item_status="failed", run_status="failed")
            seed.item_with_run(
                title=f"d{i}",
                item_status="succeeded",
                run_status="succeeded",
                delivery=seed.pull_request_delivery(100 + i),
                accounts=("acct-a", "acct-b"),
            )

    more(2)
    small = {url: _queries(admin_client, url) for url in (ATTENTION, DELIVERED)}
    more(10)
    large = {url: _queries(admin_client, url) for url in (ATTENTION, DELIVERED)}
    assert small == large
    assert max(large.values()) <= 12, large


def test_the_overview_links_the_lists_without_a_query_of_its_own(
    admin_client,
) -> None:
    """Beside "Runs finished", each kind of attention is a link to its list; the counts are
    on the list (the overview stays within its query budget, tests/routing/ops/test_pages)."""
    seed.seed_attention()
    html = page(admin_client, reverse("ops:overview"))
    box = html.split('id="throughput"')[1].split("</section>")[0]
    for kind in ("failed", "timed_out", "dead_lettered", "not_delivered"):
        assert f'href="{ATTENTION}?kind={kind}"' in box
    assert f'href="{DELIVERED}"' in box
    # The chart's own "failed or timed out (N)" is a link to the last 24 hours of them.
    legend = box.split('class="legend"')[1].split("</g>")[0]
    assert f'<a class="failed-link" href="{ATTENTION}?since=24h"><text' in legend
    assert "failed or timed out (" in legend.split("failed-link")[1]
    tabs = html.split('class="ops-tabs"')[1].split("</ul>")[0]
    assert f'href="{ATTENTION}"' in tabs and f'href="{DELIVERED}"' in tabs


def test_anonymous_users_are_sent_to_the_login(client) -> None:
    for url in (ATTENTION, DELIVERED):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
