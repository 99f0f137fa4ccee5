from __future__ import annotations

from typing import Any

import pytest

from domain.errors import ValidationError
from domain.events import (
    generic_project_path_hint,
    load_envelope,
    parse_envelope,
    project_group_hint,
    record_tags,
    task_field,
    todos_project_path_hint,
)

EVENT: dict[str, Any] = {
    "id": "evt-1",
    "type": "task.created",
    "source": "todos",
    "subject": " task-1 ",
    "data": {"id": "task-1"},
    "metadata": {"k": "v"},
}


def test_a_valid_envelope_is_parsed() -> None:
    envelope = parse_envelope(EVENT)
    assert envelope.id == "evt-1"
    assert envelope.type == "task.created"
    assert envelope.source == "todos"
    assert envelope.subject == "task-1"
    assert envelope.time is None
    assert envelope.data == {"id": "task-1"}
    assert envelope.metadata == {"k": "v"}
    assert envelope.raw is EVENT


@pytest.mark.parametrize("obj", [None, [], "x", 3, ["id"]])
def test_a_non_object_event_is_rejected(obj: object) -> None:
    with pytest.raises(ValidationError, match="^event JSON must be an object$"):
        parse_envelope(obj)


@pytest.mark.parametrize("field", ["id", "type", "source"])
@pytest.mark.parametrize("bad", [None, "", "   ", 7, {"x": 1}])
def test_missing_or_blank_required_fields_are_rejected(field: str, bad: object) -> None:
    event = dict(EVENT)
    if bad is None:
        del event[field]
    else:
        event[field] = bad
    with pytest.raises(ValidationError) as exc:
        parse_envelope(event)
    assert str(exc.value) == f"event.{field} is required"


def test_required_fields_are_checked_in_id_type_source_order() -> None:
    with pytest.raises(ValidationError, match="^event.id is required$"):
        parse_envelope({})
    with pytest.raises(ValidationError, match="^event.type is required$"):
        parse_envelope({"id": "e"})


def test_data_and_metadata_default_to_empty_objects() -> None:
    envelope = parse_envelope({**EVENT, "data": [1], "metadata": "nope"})
    assert envelope.data == {}
    assert envelope.metadata == {}


def test_invalid_json_text_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="^event JSON is not valid JSON: "):
        load_envelope("{not json")
    with pytest.raises(ValidationError, match="^event JSON must be an object$"):
        load_envelope("[1, 2]")
    assert load_envelope('{"id": "e", "type": "t", "source": "s"}').id == "e"


def test_task_field_checks_record_then_task_then_payload_then_payload_task() -> None:
    assert task_field({"title": " top ", "task": {"title": "t"}}, "title") == "top"
    assert (
        task_field({"task": {"title": "t"}, "payload": {"title": "p"}}, "title") == "t"
    )
    assert (
        task_field({"payload": {"title": "p", "task": {"title": "pt"}}}, "title") == "p"
    )
    assert task_field({"payload": {"task": {"title": " pt "}}}, "title") == "pt"


def test_task_field_ignores_blank_and_non_string_values() -> None:
    record = {"id": "  ", "task": {"id": 42}, "payload": {"id": "real"}}
    assert task_field(record, "id") == "real"
    assert task_field(record, "missing") is None
    assert task_field("not a record", "id") is None


def test_task_field_tries_each_key_across_all_locations_before_the_next_key() -> None:
    record = {"task_id": "flat", "task": {"id": "nested"}}
    assert task_field(record, "id", "task_id") == "nested"


def test_tags_come_from_arrays_and_comma_strings_trimmed() -> None:
    record = {
        "tags": [" auto:route ", "", 3, "x"],
        "task_tags": "a, b ,,x",
        "taskTags": ["c"],
    }
    assert record_tags(record) == ["auto:route", "x", "a", "b", "c"]
    assert record_tags({"tags": None}) == []
    assert record_tags(None) == []


def test_todos_project_path_prefers_task_fields_then_metadata_then_option() -> None:
    data = {"task": {"working_dir": "/from/task"}}
    meta = {"project_path": "/from/meta"}
    assert (
        todos_project_path_hint(data, meta, option="/opt", cwd="/cwd") == "/from/task"
    )
    assert todos_project_path_hint({}, meta, option="/opt", cwd="/cwd") == "/from/meta"
    assert todos_project_path_hint({}, {}, option=" /opt ", cwd="/cwd") == "/opt"
    assert todos_project_path_hint({}, {}, option=None, cwd="/cwd") == "/cwd"
    assert todos_project_path_hint({}, {}, option=None) is None


def test_todos_project_path_uses_the_route_project_path_field_first() -> None:
    data = {"cwd": "/cwd-field", "route_project_path": "/route"}
    assert todos_project_path_hint(data, {}, option=None, cwd="/c") == "/route"


def test_generic_project_path_prefers_the_option_then_data_then_metadata() -> None:
    data = {"repoPath": "/data"}
    meta = {"project_canonical_path": "/meta"}
    assert generic_project_path_hint(data, meta, option="/opt", cwd="/c") == "/opt"
    assert generic_project_path_hint(data, meta, option=None, cwd="/c") == "/data"
    assert generic_project_path_hint({}, meta, option="", cwd="/c") == "/meta"
    assert generic_project_path_hint({}, {}, option=None, cwd="/c") == "/c"


def test_project_group_prefers_the_option_then_data_then_metadata() -> None:
    assert project_group_hint({"repoGroup": "d"}, {}, option=" opt ") == "opt"
    assert (
        project_group_hint({"repoGroup": "d"}, {"projectGroup": "m"}, option=None)
        == "d"
    )
    assert project_group_hint({}, {"workspace_group": "m"}, option="  ") == "m"
    assert project_group_hint({}, {}, option=None) is None


# --- the description's Repository: line (issue 29 item 4, docs/upstream.md §5.1) -------------


def test_a_repository_line_names_the_project_when_no_path_field_does() -> None:
    data = {"description": "Fix the login.\n\nRepository: /srv/app\nMore text."}
    assert todos_project_path_hint(data, {}, option="/opt") == "/srv/app"
    # A path field still wins; the line wins over --project-path.
    assert (
        todos_project_path_hint({**data, "project_path": "/srv/other"}, {}, option=None)
        == "/srv/other"
    )
    assert todos_project_path_hint(data, {"cwd": "/from/meta"}, option=None) == (
        "/from/meta"
    )


def test_a_repository_line_in_a_nested_task_and_its_label_in_any_case() -> None:
    data = {"task": {"description": "- repository:   `/srv/app.git/`  "}}
    assert todos_project_path_hint(data, {}, option=None) == "/srv/app"


def test_an_owner_repo_line_goes_through_find_checkout_and_nowhere_without_it() -> None:
    data = {"description": "Repository: hasna/loops"}
    seen: list[str] = []

    def find(name: str) -> str | None:
        seen.append(name)
        return "/srv/hasna/loops"

    assert todos_project_path_hint(data, {}, option=None, find_checkout=find) == (
        "/srv/hasna/loops"
    )
    assert seen == ["hasna/loops"]
    assert todos_project_path_hint(data, {}, option="/opt") == "/opt"
    url = {"description": "Repository: https://github.com/hasna/loops"}
    assert todos_project_path_hint(url, {}, option=None, find_checkout=find) == (
        "/srv/hasna/loops"
    )


def test_lines_that_name_no_repository_are_ignored() -> None:
    for text in (
        "No repository here",
        "Repository:",
        "Repository: ../../etc",
        "Repository: a/b/c",
        "The Repository: /srv/app is inline",
    ):
        assert (
            todos_project_path_hint(
                {"description": text}, {}, option=None, find_checkout=lambda n: "/x"
            )
            is None
        ), text
