from __future__ import annotations

import hashlib
from typing import Any

import pytest

from domain.errors import ValidationError
from domain.keys import (
    GENERIC_EVENT,
    TODOS_TASK,
    generic_event_key,
    generic_names,
    generic_pool_seed,
    key_suffix,
    pr_fingerprint_from_task,
    route_key_for_kind,
    slug,
    todos_task_key,
    todos_task_names,
)


def test_route_kinds_map_to_route_keys() -> None:
    assert route_key_for_kind("todos-task") == TODOS_TASK == "todos-task"
    assert route_key_for_kind("generic") == GENERIC_EVENT == "generic-event"


@pytest.mark.parametrize("kind", ["generic-event", "todos", "", "Generic"])
def test_unknown_route_kinds_are_rejected(kind: str) -> None:
    with pytest.raises(ValidationError) as exc:
        route_key_for_kind(kind)
    assert str(exc.value) == "route kind must be todos-task or generic"


def test_key_suffix_matches_the_reference_example() -> None:
    assert key_suffix("todos-task:task-1") == "fc492c1c0834"
    assert key_suffix("x") == hashlib.sha256(b"x").hexdigest()[:12]


def test_todos_task_key_precedence_is_pr_then_source_path_then_task_id() -> None:
    assert todos_task_key("task-1") == "todos-task:task-1"
    assert (
        todos_task_key("task-1", source_project_path="/srv/proj")
        == "todos-task:/srv/proj:task-1"
    )
    assert (
        todos_task_key(
            "task-1", pr_fingerprint="acme/app#7", source_project_path="/srv/proj"
        )
        == "todos-task:pr:acme/app#7"
    )


def test_generic_event_key_joins_source_type_and_id() -> None:
    assert generic_event_key("todos", "task.created", "evt-1") == (
        "generic-event:todos:task.created:evt-1"
    )
    assert generic_pool_seed("todos", "task.created", "evt-1") == (
        "todos:task.created:evt-1"
    )


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"title": "Fix https://github.com/Acme/App/pull/42 now"}, "acme/app#42"),
        ({"description": "see github-pr:Acme/my.repo#0099"}, "acme/my.repo#99"),
        ({"task": {"url": "https://github.com/a/b/pull/3/files"}}, "a/b#3"),
        ({"pr_fingerprint": " Acme/App#5 "}, "acme/app#5"),
        ({"prFingerprint": "https://github.com/Acme/App/pull/6"}, "acme/app#6"),
        ({"pr_fingerprint": "Custom-Key"}, "custom-key"),
        ({"title": "nothing here"}, None),
        ({"title": "http://github.com/a/b/pull/1"}, None),
        ({"title": "https://github.com/a/b/issues/1"}, None),
        ({"title": "https://gitlab.com/a/b/pull/1"}, None),
        ({}, None),
    ],
)
def test_pr_fingerprint_is_derived_from_fields_urls_and_handles(
    data: dict[str, Any], expected: str | None
) -> None:
    assert pr_fingerprint_from_task(data) == expected


def test_explicit_pr_fingerprint_wins_over_urls_in_text() -> None:
    data = {
        "title": "https://github.com/a/b/pull/1",
        "pr_fingerprint": "c/d#2",
    }
    assert pr_fingerprint_from_task(data) == "c/d#2"


def test_the_earliest_pr_reference_in_a_field_wins() -> None:
    text = "github-pr:x/y#1 then https://github.com/a/b/pull/2"
    assert pr_fingerprint_from_task({"description": text}) == "x/y#1"


def test_todos_task_names_use_the_default_prefix_and_key_suffix() -> None:
    workflow, loop = todos_task_names(None, "task-1", "todos-task:task-1")
    assert workflow == "event:todos-task:task-1:fc492c1c0834:workflow"
    assert loop == "event:todos-task:task-1:fc492c1c0834:run"


def test_todos_task_names_truncate_the_task_id_to_eight_characters() -> None:
    workflow, _ = todos_task_names("ops", "0123456789abcdef", "k")
    assert workflow == f"ops:01234567:{key_suffix('k')}:workflow"


def test_generic_names_slug_source_and_type() -> None:
    workflow, loop = generic_names(
        None, "@hasna/Todos", "task created", "evt-123456789"
    )
    suffix = key_suffix(
        generic_event_key("@hasna/Todos", "task created", "evt-123456789")
    )
    assert (
        workflow == f"event:generic:hasna-todos:task-created:evt-1234:{suffix}:workflow"
    )
    assert loop == f"event:generic:hasna-todos:task-created:evt-1234:{suffix}:run"


def test_generic_events_whose_ids_share_eight_characters_get_names_of_their_own() -> (
    None
):
    first, _ = generic_names(None, "ci", "deploy", "deploy-2026-12-07-a")
    second, _ = generic_names(None, "ci", "deploy", "deploy-2026-12-07-b")
    assert first != second
    assert first == generic_names(None, "ci", "deploy", "deploy-2026-12-07-a")[0]


def test_generic_names_fall_back_when_slugs_are_empty() -> None:
    workflow, _ = generic_names("p", "@@@", "!!", "e")
    suffix = key_suffix(generic_event_key("@@@", "!!", "e"))
    assert workflow == f"p:source:type:e:{suffix}:workflow"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Task.Created", "task.created"),
        ("a b  c", "a-b-c"),
        ("@hasna/todos", "hasna-todos"),
        ("--x--", "-x-"),
        ("-a-", "a"),
        ("ok:fine_no~x", "ok:fine_no-x"),
        ("héllo wörld", "h-llo-w-rld"),
        ("", "fallback"),
        ("***", "fallback"),
    ],
)
def test_slug_rules(value: str, expected: str) -> None:
    assert slug(value, "fallback") == expected


def test_slug_is_capped_at_eighty_characters() -> None:
    assert slug("a" * 100, "f") == "a" * 80
    # The edge dash is stripped before truncating, so the result may end in "-".
    assert slug("b" * 79 + "--c", "f") == "b" * 79 + "-"
