"""The commands and the API say the same thing (issue 29 items 9, 10, 13): never-routable
envelopes warned about by both in the same words (and refused by both in strict mode),
`route=now` without `kind`, API errors naming the parameter sent."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from routing.drains import drain_options, drain_run
from routing.drains.routable import never_routable
from routing.models import InboxEvent
from tests.routing.api.helpers import bearer, make_token, post_events, row_counts
from tests.routing.helpers import generic_event, todos_event

pytestmark = pytest.mark.django_db


def _never() -> list[dict]:
    no_opt_in = todos_event("N-1", tags=[])
    no_project = generic_event()
    del no_project["data"]["project_path"]
    return [todos_event("N-0"), no_opt_in, no_project]


def _ingest(tmp_path: Path, envelopes: list[dict], *args: str) -> tuple[str, str]:
    source = tmp_path / "events.jsonl"
    source.write_text("".join(json.dumps(e) + "\n" for e in envelopes))
    out, err = io.StringIO(), io.StringIO()
    call_command("ingest_events", str(source), *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


# --- item 9 ------------------------------------------------------------------------------------


def test_ingest_events_warns_with_the_words_of_the_api(
    client: Client, tmp_path: Path
) -> None:
    envelopes = _never()
    out, err = _ingest(tmp_path, envelopes)
    assert "new=3" in out
    api = post_events(client, make_token("ingest")[1], _never())
    warnings = api.json()["warnings"]
    assert [w["warning"] for w in warnings] == [
        "missing explicit route opt-in",
        "no project path: the event names none (data.project_path and the other "
        "project path fields) and no --project-path was given",
    ]
    for warning in warnings:
        assert f"can never route: {warning['warning']}" in err
    assert "warning line 2 (@hasna/todos evt-N-1, todos-task)" in err
    # One check behind both.
    items = [(f"line {n}", e) for n, e in enumerate(envelopes, start=1)]
    assert [w["warning"] for w in never_routable(items, cwd=str(tmp_path))] == [
        w["warning"] for w in warnings
    ]


def test_ingest_events_json_lists_the_warnings(tmp_path: Path) -> None:
    out, _ = _ingest(tmp_path, _never(), "--json")
    value = json.loads(out)
    assert [w["at"] for w in value["warnings"]] == ["line 2", "line 3"]
    assert value["warnings"][0]["kind"] == "todos-task"


def test_ingest_events_strict_refuses_and_stores_nothing(tmp_path: Path) -> None:
    before = row_counts()
    with pytest.raises(CommandError) as refused:
        _ingest(tmp_path, _never(), "--strict")
    assert str(refused.value) == (
        "2 envelope(s) can never be routed (--strict refuses the batch); first at "
        "line 2: missing explicit route opt-in; nothing stored"
    )
    assert row_counts() == before
    out, err = _ingest(tmp_path, [todos_event("N-2")], "--strict")
    assert "new=1" in out and "can never route" not in err
    assert InboxEvent.objects.count() == 1


def test_the_api_strict_message_uses_the_same_words(client: Client) -> None:
    response = post_events(client, make_token("ingest")[1], _never(), query="strict=1")
    assert response.status_code == 400
    assert response.json()["error"] == (
        "2 envelope(s) can never be routed (strict=1 refuses the batch); first at "
        "item 2: missing explicit route opt-in"
    )


# --- item 10 -----------------------------------------------------------------------------------


def test_route_now_without_kind_routes_a_task_event_as_todos_task(
    client: Client,
) -> None:
    token = make_token("ingest")[1]
    response = post_events(client, token, todos_event("K-1"), query="route=now")
    assert response.status_code == 202
    answer = response.json()
    assert answer["kind"] == "todos-task" and answer["kindFrom"] == "event type"
    [result] = answer["results"]
    assert result["kind"] == "created" and result["routeKind"] == "todos-task"
    assert result["idempotencyKey"] == "todos-task:K-1"
    mixed = post_events(
        client, token, [todos_event("K-2"), generic_event()], query="route=now"
    ).json()
    assert mixed["kind"] == ["generic", "todos-task"]
    assert [r["routeKind"] for r in mixed["results"]] == ["todos-task", "generic"]
    explicit = post_events(
        client, token, generic_event(), query="route=now&kind=generic"
    ).json()
    assert explicit["kind"] == "generic" and explicit["kindFrom"] == "kind"


# --- item 13 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("route=now&max_active=-2", "max_active must be a positive integer"),
        (
            "route=now&max_active_per_project=0",
            "max_active_per_project must be a positive integer",
        ),
        ("route=now&max_per_profile=x", "max_per_profile"),
    ],
)
def test_api_errors_name_the_parameter_sent(
    client: Client, query: str, message: str
) -> None:
    response = post_events(
        client, make_token("ingest")[1], generic_event(), query=query
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error and "--" not in error


def test_drains_accept_generic_as_well_as_generic_event(client: Client) -> None:
    drain_run(options=drain_options("generic", {}), env={})
    token = make_token("read")[1]
    answers = [
        client.get(f"/api/v1/drains?kind={kind}", **bearer(token))
        for kind in ("generic", "generic-event")
    ]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["drains"] == answers[1].json()["drains"]
    assert len(answers[0].json()["drains"]) == 1
    assert client.get("/api/v1/drains?kind=cron", **bearer(token)).status_code == 400


def test_route_now_refuses_a_new_task_as_a_route_error_and_dedupes_a_routed_one(
    client: Client, tmp_path: Path, settings: Any
) -> None:
    """docs/upstream.md §3.2.9 -> docs/upstream.md §3.2.10 through the API: worktree required on a path that
    is not a git work tree."""
    plain = tmp_path / "plain"
    plain.mkdir()
    settings.LOOPSWEB_PROJECT_ROOTS = [str(tmp_path)]
    token = make_token("ingest")[1]
    routed = todos_event("W-1", project=str(plain))
    first = post_events(client, token, routed, query="route=now").json()
    assert first["results"][0]["kind"] == "created"
    replay = dict(routed, id="evt-W-1-again")
    query = "route=now&worktree_mode=required"
    again = post_events(client, token, replay, query=query).json()
    assert again["results"][0]["kind"] == "deduped"
    fresh = post_events(
        client, token, todos_event("W-2", project=str(plain)), query=query
    ).json()
    [result] = fresh["results"]
    assert result["kind"] == "skipped" and result["routeError"] is True
    assert "fatal" not in result
    assert result["reason"] == (
        f"worktreeMode=required but projectPath is not an existing git repository: {plain}"
    )
    assert InboxEvent.objects.get(event_id="evt-W-2").state == "skipped"
