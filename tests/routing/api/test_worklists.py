"""`GET /api/v1/attention` and `GET /api/v1/delivered`: the rows of
/ops/attention/ and /ops/delivered/ as JSON, their filters, keyset pages and refusals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from tests.routing import worklists_seed as seed
from tests.routing.api.helpers import bearer, make_token, row_counts

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


def test_attention_lists_each_kind_with_its_reason_accounts_and_usage(
    read: Callable[..., Any],
) -> None:
    items = seed.seed_attention()
    rows = {row["workItemId"]: row for row in read("/api/v1/attention")["attention"]}
    assert set(rows) == {items[k].id for k in ("failed", "timed_out", "not_delivered")}

    failed = rows[items["failed"].id]
    assert failed["title"] == seed.HOSTILE_TITLE  # JSON carries the text as it is
    assert failed["kinds"] == ["failed"] and failed["status"] == "failed"
    assert failed["reason"] == "worker exited 1: tests fail"
    assert failed["failedStep"] == {
        "stepId": "worker",
        "status": "failed",
        "reasonCode": "login_failed",
    }
    assert failed["accounts"] == ["acct-a", "acct-b"]
    assert failed["usage"] == {
        "inputTokens": 2000,
        "outputTokens": 200,
        "cachedTokens": None,
        "costUsd": 0.5,
    }
    assert failed["runId"] == items["failed"].workflow_run_id
    assert failed["deliveryError"] is None

    assert rows[items["timed_out"].id]["kinds"] == ["timed_out"]
    undelivered = rows[items["not_delivered"].id]
    assert undelivered["kinds"] == ["not_delivered"] and undelivered["reason"] is None
    assert undelivered["deliveryError"] == seed.REFUSED
    assert undelivered["usage"]["costUsd"] is None


def test_a_dead_lettered_item_is_listed_as_such_with_its_reason(
    read: Callable[..., Any],
) -> None:
    items = seed.seed_attention()
    dead = seed.dead_lettered_item()
    rows = {row["workItemId"]: row for row in read("/api/v1/attention")["attention"]}
    assert items["dead_letter"].id not in rows  # an operator's dead-letter: not listed
    row = rows[dead.id]
    assert row["kinds"] == ["dead_lettered"] and row["status"] == "dead_letter"
    assert row["reason"] == seed.DEAD_LETTERED
    assert row["runStatus"] == "failed"
    assert row["failedStep"] == {
        "stepId": "worker",
        "status": "failed",
        "reasonCode": "failed",
    }
    only = read("/api/v1/attention?kind=dead_lettered")["attention"]
    assert [r["workItemId"] for r in only] == [dead.id]
    failed = read("/api/v1/attention?kind=failed")["attention"]
    assert [r["workItemId"] for r in failed] == [items["failed"].id]


def test_attention_filters_and_pages_with_a_cursor(read: Callable[..., Any]) -> None:
    items = seed.seed_attention()
    only = read("/api/v1/attention?kind=timed_out")["attention"]
    assert [r["workItemId"] for r in only] == [items["timed_out"].id]
    scoped = read("/api/v1/attention?route_scope=nightly&project=/srv/web")
    assert {r["workItemId"] for r in scoped["attention"]} == {
        items["failed"].id,
        items["not_delivered"].id,
    }

    seen: list[str] = []
    url = "/api/v1/attention?limit=1"
    while url:
        answer = read(url)
        assert len(answer["attention"]) == 1
        seen += [r["workItemId"] for r in answer["attention"]]
        cursor = answer["nextCursor"]
        url = f"/api/v1/attention?limit=1&cursor={cursor}" if cursor else ""
    assert sorted(seen) == sorted(
        items[k].id for k in ("failed", "timed_out", "not_delivered")
    )
    assert len(seen) == 3


def test_delivered_lists_pull_requests_and_pushed_branches(
    read: Callable[..., Any],
) -> None:
    runs = seed.seed_delivered()
    rows = {row["runId"]: row for row in read("/api/v1/delivered")["delivered"]}
    assert set(rows) == {runs[k].id for k in ("open", "merged", "pushed")}
    opened = rows[runs["open"].id]
    assert opened["state"] == "open"
    assert opened["pullRequest"] == {
        "repo": "acme/web",
        "number": 12,
        "url": "https://github.com/acme/web/pull/12",
        "state": "open",
        "draft": False,
    }
    assert opened["branch"] == "loopsweb/run-12"
    assert opened["commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert opened["workItemId"] == runs["open"].work_item_id
    assert opened["accounts"] == ["acct-a", "acct-b"]
    assert opened["usage"]["costUsd"] == 0.5
    pushed = rows[runs["pushed"].id]
    assert pushed["state"] == "pushed" and pushed["pullRequest"] is None
    assert pushed["remoteUrl"] == "https://git.example.com/acme/web.git"

    merged = read("/api/v1/delivered?state=merged")["delivered"]
    assert [r["runId"] for r in merged] == [runs["merged"].id]
    assert read("/api/v1/delivered?state=closed")["delivered"] == []
    first = read("/api/v1/delivered?limit=2")
    assert len(first["delivered"]) == 2 and first["nextCursor"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/api/v1/attention?kind=lost", "kind: Select a valid choice"),
        ("/api/v1/attention?since=tomorrow", "since: since must be a duration"),
        ("/api/v1/attention?state=open", "unknown query parameter: state"),
        ("/api/v1/delivered?state=draft", "state: Select a valid choice"),
        ("/api/v1/delivered?kind=failed", "unknown query parameter: kind"),
        ("/api/v1/delivered?limit=201", "limit:"),
        ("/api/v1/delivered?cursor=nope", "cursor: invalid cursor"),
    ],
)
def test_a_bad_query_is_a_400_that_says_why_and_writes_nothing(
    read: Callable[..., Any], url: str, message: str
) -> None:
    seed.seed_attention()
    before = row_counts()
    assert message in read(url, status=400)["error"]
    assert row_counts() == before


def test_the_lists_need_a_read_token(client: Client) -> None:
    _, ingest = make_token("ingest")
    for url in ("/api/v1/attention", "/api/v1/delivered"):
        assert client.get(url).status_code == 401
        refused = client.get(url, **bearer(ingest))
        assert refused.status_code == 403 and "read" in refused.json()["error"]
