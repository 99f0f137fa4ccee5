"""POST /api/v1/events: idempotent ingest, route=now, limits and JSON errors (issue 8)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from ledger.models import WorkflowRun, WorkflowWorkItem
from routing.models import InboxEvent
from tests.routing.api.helpers import (
    EVENTS_URL,
    bearer,
    make_token,
    post_events,
    row_counts,
)
from tests.routing.helpers import generic_event, todos_event

pytestmark = pytest.mark.django_db


@pytest.fixture
def token() -> str:
    return make_token("ingest")[1]


def test_one_envelope_is_stored_and_answered_with_202(
    client: Client, token: str
) -> None:
    event = generic_event()
    response = post_events(client, token, event)
    assert response.status_code == 202
    assert response.json() == {
        "accepted": [{"source": "ci", "id": event["id"]}],
        "duplicates": [],
    }
    row = InboxEvent.objects.get()
    assert (row.source, row.event_id, row.state) == ("ci", event["id"], "pending")
    assert row.data == event["data"] and row.project_hint == "/srv/app"


def test_an_array_is_stored_once_and_redelivery_reports_duplicates(
    client: Client, token: str
) -> None:
    first, second = generic_event(), generic_event()
    response = post_events(client, token, [first, second, first])
    assert response.status_code == 202
    body = response.json()
    assert [a["id"] for a in body["accepted"]] == [first["id"], second["id"]]
    assert body["duplicates"] == [{"source": "ci", "id": first["id"]}]

    again = post_events(client, token, [second, first]).json()
    assert again["accepted"] == [] and len(again["duplicates"]) == 2
    assert InboxEvent.objects.count() == 2


def test_one_bad_envelope_rejects_the_whole_batch(client: Client, token: str) -> None:
    before = row_counts()
    bad = {"id": "x", "type": "t"}  # no source
    response = post_events(client, token, [generic_event(), bad])
    assert response.status_code == 400
    body = response.json()
    assert "item 2" in body["error"] and "event.source is required" in body["error"]
    assert body["invalid"] == [{"at": "item 2", "error": "event.source is required"}]
    assert row_counts() == before


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "invalid JSON"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"[]", "no envelopes"),
        (b"42", "event JSON must be an object"),
        (b'{"id": "a", "type": "t", "source": "s", "n": NaN}', "finite"),
        (b'{"id": "a", "type": "t", "source": "s", "n": 1e999}', "finite"),
        (b'{"id": "a\\u0000", "type": "t", "source": "s"}', "NUL"),
        (b'{"id": "\\ud800", "type": "t", "source": "s"}', "surrogates"),
        (b'{"id": "' + b"x" * 501 + b'", "type": "t", "source": "s"}', "event.id"),
        (b"[" * 40 + b"]" * 40, "nested deeper than 32"),
        (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, "nested deeper"),
    ],
)
def test_malformed_bodies_are_400_json_errors_and_store_nothing(
    client: Client, token: str, body: bytes, fragment: str
) -> None:
    before = row_counts()
    response = post_events(client, token, body)
    assert response.status_code == 400, response.content[:300]
    assert response["Content-Type"] == "application/json"
    assert fragment in response.json()["error"]
    assert row_counts() == before


def test_depth_counts_the_envelope_not_the_batch_array(
    client: Client, token: str, settings
) -> None:
    settings.LOOPSWEB_MAX_JSON_DEPTH = 4
    event = {
        "id": "d",
        "type": "t",
        "source": "s",
        "data": {"a": {"b": [1]}},
    }  # depth 4
    assert post_events(client, token, event).status_code == 202
    event2 = {**event, "id": "d2"}
    assert post_events(client, token, [event2]).status_code == 202
    deeper = {**event, "id": "d3", "data": {"a": {"b": [[1]]}}}
    assert post_events(client, token, [deeper]).status_code == 400


def test_size_limits_are_413(client: Client, token: str, settings) -> None:
    settings.LOOPSWEB_MAX_EVENT_BYTES = 2048
    settings.LOOPSWEB_API_MAX_EVENTS = 3
    before = row_counts()
    big = generic_event(blob="x" * 3000)
    response = post_events(client, token, big)
    assert response.status_code == 413
    assert response.json() == {"error": "request body is larger than 2048 bytes"}
    too_many = [generic_event() for _ in range(4)]
    response = post_events(client, token, too_many)
    assert response.status_code == 413
    assert response.json()["error"] == "at most 3 envelopes per request"
    assert row_counts() == before
    assert post_events(client, token, too_many[:3]).status_code == 202


def test_a_body_longer_than_its_content_length_claims_is_cut_at_the_limit(
    token: str, settings
) -> None:
    # A client that lies about (or omits) Content-Length is judged on the bytes read.
    from django.test import RequestFactory

    from routing.api.views import events

    settings.LOOPSWEB_MAX_EVENT_BYTES = 1024
    body = json.dumps(generic_event(blob="y" * 2000)).encode()
    request = RequestFactory().post(
        EVENTS_URL, data=body, content_type="application/json", **bearer(token)
    )
    request.META["CONTENT_LENGTH"] = ""  # the stream still holds all of the body
    response = events(request)
    assert response.status_code == 413 and InboxEvent.objects.count() == 0


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/json; charset=latin-1",
    ],
)
def test_other_content_types_are_415(
    client: Client, token: str, content_type: str
) -> None:
    response = post_events(client, token, generic_event(), content_type=content_type)
    assert response.status_code == 415
    assert "application/json" in response.json()["error"]
    assert InboxEvent.objects.count() == 0


def test_get_with_an_ingest_token_is_405_with_allow(client: Client, token: str) -> None:
    response = client.get(EVENTS_URL, **bearer(token))
    assert response.status_code == 405
    assert response["Allow"] == "POST" and "GET" in response.json()["error"]


def test_token_posts_need_no_csrf_token(token: str) -> None:
    strict = Client(enforce_csrf_checks=True)
    response = post_events(strict, token, generic_event())
    assert response.status_code == 202


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ("route=later", "route: Select a valid choice"),
        ("route=now&kind=cron", "kind: Select a valid choice"),
        ("route=now&max_active=zero", "max_active must be a positive integer"),
        ("route=now&max_active=-2", "max_active must be a positive integer"),
        ("route=now&max_actve=2", "unknown query parameter: max_actve"),
        ("max_active=2", "route options need route=now"),
        ("route=now&dry_run=1", "unknown query parameter: dry_run"),
        ("route=now&provider=gpt", "provider must be one of"),
        ("route=now&max_attempts=0", "max_attempts must be a positive integer"),
        ("route=now&retry_backoff=soon", "retry_backoff must be a non-negative"),
    ],
)
def test_bad_query_strings_are_400_before_anything_is_read(
    client: Client, token: str, query: str, fragment: str
) -> None:
    response = post_events(client, token, generic_event(), query=query)
    assert response.status_code == 400
    assert fragment in response.json()["error"]
    assert InboxEvent.objects.count() == 0


def test_route_now_admits_and_marks_the_inbox_rows_like_a_drain(
    client: Client, token: str
) -> None:
    events = [generic_event(project="/srv/one"), generic_event(project="/srv/one")]
    response = post_events(
        client, token, events, query="route=now&max_active=1&max_active_scope=api"
    )
    assert response.status_code == 202
    body = response.json()
    assert body["kind"] == "generic"
    kinds = [r["kind"] for r in body["results"]]
    assert kinds == ["created", "throttled"]
    created, throttled = body["results"]
    assert created["workItemStatus"] == "admitted"
    assert throttled["reasonCode"] == "route_cap"

    rows = {r.event_id: r for r in InboxEvent.objects.all()}
    first, second = rows[events[0]["id"]], rows[events[1]["id"]]
    assert first.state == "admitted" and first.work_item_id == created["workItemId"]
    assert first.routed_at is not None
    assert second.state == "deferred" and second.reason_code == "route_cap"
    item = WorkflowWorkItem.objects.get(pk=created["workItemId"])
    assert item.route_scope == "api" and item.status == "admitted"
    assert WorkflowRun.objects.filter(work_item=item).count() == 1


def test_route_now_stores_the_retry_options_on_the_loop(
    client: Client, token: str
) -> None:
    response = post_events(
        client,
        token,
        generic_event(),
        query="route=now&max_attempts=3&retry_backoff=2m",
    )
    assert response.status_code == 202
    (created,) = response.json()["results"]
    item = WorkflowWorkItem.objects.select_related("loop").get(pk=created["workItemId"])
    assert (item.loop.max_attempts, item.loop.retry_delay_ms) == (3, 120_000)


def test_route_now_twice_is_idempotent(client: Client, token: str) -> None:
    event = generic_event()
    post_events(client, token, event, query="route=now")
    again = post_events(client, token, event, query="route=now").json()
    assert again["accepted"] == [] and again["results"] == []
    assert WorkflowWorkItem.objects.count() == 1 and WorkflowRun.objects.count() == 1


def test_route_now_uses_the_route_key_as_scope_not_the_servers_environment(
    client: Client, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPS_LOOP_NAME", "web-process")
    body = post_events(client, token, generic_event(), query="route=now").json()
    item = WorkflowWorkItem.objects.get(pk=body["results"][0]["workItemId"])
    assert item.route_scope == "generic-event"


def test_route_now_todos_tasks_skip_ineligible_and_refuse_unroutable(
    client: Client, token: str
) -> None:
    untagged = todos_event("task-1", tags=[])
    body = post_events(
        client, token, untagged, query="route=now&kind=todos-task"
    ).json()
    assert body["results"][0]["kind"] == "skipped"
    assert InboxEvent.objects.get().state == "skipped"

    before = row_counts()
    no_task_id = {"id": "e9", "type": "task.created", "source": "todos", "data": {}}
    response = post_events(
        client,
        token,
        [todos_event("task-2"), no_task_id],
        query="route=now&kind=todos-task",
    )
    assert response.status_code == 400
    assert "cannot be routed as todos-task; first at item 2" in response.json()["error"]
    assert row_counts() == before


def test_route_now_refuses_values_that_overflow_ledger_columns(
    client: Client, token: str
) -> None:
    before = row_counts()
    response = post_events(
        client, token, generic_event(), query="route=now&max_active_scope=" + "s" * 201
    )
    assert response.status_code == 400
    assert "route scope is longer than 200 characters" in response.json()["error"]
    assert row_counts() == before


# --- warnings for envelopes that can never route (issue 19) -----------------------------------


def test_envelopes_that_can_never_route_are_accepted_with_warnings(
    client: Client, token: str
) -> None:
    good = todos_event()
    no_opt_in = todos_event(tags=[])
    manual = todos_event(tags=["auto:route", "manual"])
    no_id = {
        "id": "evt-no-id",
        "type": "task.created",
        "source": "@hasna/todos",
        "data": {"title": "no id", "tags": ["auto:route"], "project_path": "/srv/a"},
    }
    response = post_events(client, token, [good, no_opt_in, manual, no_id])
    assert response.status_code == 202
    body = response.json()
    assert len(body["accepted"]) == 4
    warnings = {w["id"]: w for w in body["warnings"]}
    assert set(warnings) == {no_opt_in["id"], manual["id"], "evt-no-id"}
    assert warnings[no_opt_in["id"]]["warning"] == "missing explicit route opt-in"
    assert "disallowed tag: manual" in warnings[manual["id"]]["warning"]
    assert warnings["evt-no-id"]["kind"] == "todos-task"
    assert warnings["evt-no-id"]["at"] == "item 4"
    assert InboxEvent.objects.count() == 4


def test_a_clean_batch_has_no_warnings_key(client: Client, token: str) -> None:
    body = post_events(client, token, [todos_event(), generic_event()]).json()
    assert "warnings" not in body


def test_strict_refuses_a_batch_with_a_never_routable_envelope(
    client: Client, token: str
) -> None:
    before = row_counts()
    bad = todos_event(tags=[])
    response = post_events(client, token, [todos_event(), bad], query="strict=1")
    assert response.status_code == 400
    body = response.json()
    assert "can never be routed" in body["error"] and "item 2" in body["error"]
    assert [w["id"] for w in body["warnings"]] == [bad["id"]]
    assert row_counts() == before
    ok = post_events(client, token, [todos_event()], query="strict=1")
    assert ok.status_code == 202


def test_strict_takes_only_0_or_1(client: Client, token: str) -> None:
    response = post_events(client, token, [todos_event()], query="strict=yes")
    assert response.status_code == 400 and "strict" in response.json()["error"]
