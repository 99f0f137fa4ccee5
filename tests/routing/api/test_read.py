"""Read endpoints: filters, keyset pagination, details and fixed query counts (issue 8)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import AccountCooldown, WorkflowWorkItem, WorkItemDeferral
from routing.models import DrainRecord, InboxEvent
from tests.factories import make_run, make_step_run, make_work_item
from tests.routing.api.helpers import bearer, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def read(client: Client) -> Callable[..., Any]:
    _, token = make_token("read")
    client.get("/api/v1/drains", **bearer(token))  # first use writes last_used_at

    def get(url: str, status: int = 200) -> Any:
        response = client.get(url, **bearer(token))
        assert response.status_code == status, response.content[:300]
        return response.json()

    return get


def _queries(read: Callable[..., Any], url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        read(url)
    return len(captured)


def _item_with_history(n: int, *, account: str = "acct-a") -> WorkflowWorkItem:
    """An item with n deferrals, n runs of two steps each, and n inbox deliveries."""
    item = make_work_item(
        status="deferred", route_scope="nightly", reason_code="route_cap"
    )
    for i in range(n):
        WorkItemDeferral.objects.create(
            work_item=item,
            reason_code="route_cap",
            reason=f"full {i}",
            counts_json={"scope": i},
            limits_json={"maxActive": 1},
        )
        run = make_run(work_item=item, status="succeeded")
        make_step_run(
            workflow_run=run, step_id="worker", sequence=0, account_profile=account
        )
        make_step_run(
            workflow_run=run, step_id="verifier", sequence=1, account_profile="acct-b"
        )
        InboxEvent.objects.create(
            source="ci", event_id=f"{item.id}-{i}", event_type="t", work_item=item
        )
    return item


def test_work_items_filter_by_status_scope_project_reason_and_account(
    read: Callable[..., Any],
) -> None:
    a = make_work_item(status="admitted", route_scope="s1", project_key="/p1")
    b = make_work_item(
        status="deferred",
        route_scope="s1",
        project_key="/p2",
        reason_code="profile_cap",
    )
    c = make_work_item(status="deferred", route_scope="s2", project_key="/p1")
    run = make_run(work_item=c)
    make_step_run(workflow_run=run, account_profile="team-x")
    make_step_run(workflow_run=run, step_id="v", sequence=1, account_profile="team-x")

    def ids(query: str) -> set[str]:
        return {i["id"] for i in read(f"/api/v1/work-items?{query}")["workItems"]}

    assert ids("") == {a.id, b.id, c.id}
    assert ids("status=deferred") == {b.id, c.id}
    assert ids("route_scope=s1") == {a.id, b.id}
    assert ids("project=/p1") == {a.id, c.id}
    assert ids("reason_code=profile_cap") == {b.id}
    assert ids("account=team-x") == {c.id}  # two steps on it, still one row
    assert ids("account=team-y") == set()
    assert ids("status=deferred&route_scope=s1") == {b.id}

    first = read("/api/v1/work-items?status=admitted")["workItems"][0]
    assert first["routeScope"] == "s1" and first["createdAt"].endswith("Z")


def test_cursor_pages_walk_every_item_once_newest_first_even_with_equal_times(
    read: Callable[..., Any],
) -> None:
    items = [make_work_item() for _ in range(7)]
    # Three items share one created_at: the id breaks the tie, so none is skipped or repeated.
    same = timezone.now()
    WorkflowWorkItem.objects.filter(pk__in=[i.id for i in items[2:5]]).update(
        created_at=same
    )
    expected = [
        i.id
        for i in sorted(
            WorkflowWorkItem.objects.all(),
            key=lambda i: (i.created_at, i.id),
            reverse=True,
        )
    ]
    seen: list[str] = []
    url = "/api/v1/work-items?limit=3"
    pages = 0
    while True:
        page = read(url)
        pages += 1
        seen += [i["id"] for i in page["workItems"]]
        if page["nextCursor"] is None:
            break
        url = f"/api/v1/work-items?limit=3&cursor={page['nextCursor']}"
    assert seen == expected and pages == 3


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ("limit=201", "limit: Ensure this value is less than or equal to 200"),
        ("limit=0", "limit: Ensure this value is greater than or equal to 1"),
        ("cursor=bm90LWEtY3Vyc29y", "cursor: invalid cursor"),
        ("cursor=%%%", "cursor: invalid cursor"),
        # ["2026-01-01T00:00:00+00:00", "a\u0000b"]: NUL would be a PostgreSQL error
        (
            "cursor=WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgImFcdTAwMDBiIl0",
            "invalid cursor",
        ),
        ("status=sleeping", "status: Select a valid choice"),
        ("stauts=deferred", "unknown query parameter: stauts"),
        ("route_scope=a%00b", "parameter 'route_scope' holds a NUL character"),
    ],
)
def test_bad_list_queries_are_400(
    read: Callable[..., Any], query: str, fragment: str
) -> None:
    assert fragment in read(f"/api/v1/work-items?{query}", 400)["error"]


def test_work_item_detail_has_deferrals_runs_steps_and_deliveries_in_order(
    read: Callable[..., Any],
) -> None:
    item = _item_with_history(2)
    body = read(f"/api/v1/work-items/{item.id}")
    assert body["id"] == item.id and body["reasonCode"] == "route_cap"
    assert [d["reason"] for d in body["deferrals"]] == ["full 0", "full 1"]
    assert body["deferrals"][0]["counts"] == {"scope": 0}
    assert len(body["runs"]) == 2
    steps = body["runs"][0]["steps"]
    assert [(s["stepId"], s["accountProfile"]) for s in steps] == [
        ("worker", "acct-a"),
        ("verifier", "acct-b"),
    ]
    assert "stdout" not in steps[0]
    assert len(body["inboxEvents"]) == 2 and body["inboxEvents"][0]["source"] == "ci"
    assert read("/api/v1/work-items/nope", 404) == {"error": "not found"}
    # PostgreSQL refuses NUL even in a WHERE clause; it must be a 404, not a 500.
    assert read("/api/v1/work-items/a%00b", 404) == {"error": "not found"}


def test_accounts_show_load_cap_and_cooldown(read: Callable[..., Any]) -> None:
    now = timezone.now()
    run = make_run(status="running")
    make_step_run(workflow_run=run, status="running", account_profile="a1")
    queued = make_run(status="queued")
    make_step_run(workflow_run=queued, account_profile="a2")
    AccountCooldown.objects.create(
        account_profile="a2", until=now + timedelta(minutes=5), reason="429"
    )
    DrainRecord.objects.create(
        kind="generic-event",
        route_scope="nightly",
        started_at=now,
        options_json={
            "kind": "generic",
            "auth_profile_pool": "a1,a2,a3",
            "max_per_profile": 1,
        },
    )
    accounts = {a["profile"]: a for a in read("/api/v1/accounts")["accounts"]}
    assert set(accounts) == {"a1", "a2", "a3"}
    assert accounts["a1"]["running"] == 1 and accounts["a1"]["atCap"] is True
    assert accounts["a1"]["maxPerProfile"] == 1
    assert accounts["a2"]["reserved"] == 1 and accounts["a2"]["load"] == 1
    cooling = accounts["a2"]["cooldown"]
    assert cooling["reason"] == "429" and 240 < cooling["remainingSeconds"] <= 300
    assert accounts["a3"]["load"] == 0 and accounts["a3"]["cooldown"] is None
    assert accounts["a1"]["registry"] is None and accounts["a1"]["usage7d"] is None


def test_drains_list_counts_and_detail_results(read: Callable[..., Any]) -> None:
    now = timezone.now()
    older = DrainRecord.objects.create(
        kind="todos-task", started_at=now - timedelta(minutes=1), created=2
    )
    newer = DrainRecord.objects.create(
        kind="generic-event",
        started_at=now,
        throttled=1,
        results_json=[{"kind": "throttled", "reasonCode": "route_cap"}],
        options_json={"kind": "generic", "max_active": 1},
    )
    listed = read("/api/v1/drains")["drains"]
    assert [d["id"] for d in listed] == [newer.id, older.id]
    assert "results" not in listed[0] and listed[0]["throttled"] == 1
    assert [d["id"] for d in read("/api/v1/drains?kind=todos-task")["drains"]] == [
        older.id
    ]
    detail = read(f"/api/v1/drains/{newer.id}")
    assert detail["results"] == [{"kind": "throttled", "reasonCode": "route_cap"}]
    assert detail["options"]["max_active"] == 1
    assert read("/api/v1/drains/none", 404) == {"error": "not found"}
    assert read("/api/v1/drains/a%00b", 404) == {"error": "not found"}


def _populate(n: int) -> WorkflowWorkItem:
    now = timezone.now()
    for i in range(WorkflowWorkItem.objects.count(), n):  # top up to n of each
        run = make_run(status="running", work_item=make_work_item(status="running"))
        make_step_run(workflow_run=run, status="running", account_profile=f"acct-{i}")
        AccountCooldown.objects.create(
            account_profile=f"cool-{i}", until=now + timedelta(minutes=1)
        )
        DrainRecord.objects.create(
            kind="generic-event",
            route_scope=f"scope-{i}",
            started_at=now - timedelta(seconds=i),
            options_json={"auth_profile_pool": f"acct-{i},spare-{i}"},
        )
    return _item_with_history(n)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # token look-up + the page
        ("/api/v1/work-items?limit=200", 2),
        ("/api/v1/work-items?account=acct-1", 2),
        ("/api/v1/drains?limit=200", 2),
        # token + item + deferrals + runs + steps + their attempts + inbox deliveries
        # + revisions (their runs' steps: none here)
        ("/api/v1/work-items/{item}", 8),
        ("/api/v1/drains/{drain}", 2),
        # token + load (2) + cooldowns + drain schedules + latest drain per scope
        # + the account registry + the usage windows
        ("/api/v1/accounts", 7),
    ],
)
def test_query_counts_do_not_grow_with_rows(
    read: Callable[..., Any], url: str, expected: int
) -> None:
    counts = []
    for n in (3, 30):
        item = _populate(n)
        drain = DrainRecord.objects.order_by("started_at").first()
        assert drain is not None
        counts.append(_queries(read, url.format(item=item.id, drain=drain.id)))
        body = read(url.format(item=item.id, drain=drain.id))
        if "/work-items/" in url:
            assert len(body["runs"]) == n and len(body["deferrals"]) == n
    assert counts == [expected, expected]
