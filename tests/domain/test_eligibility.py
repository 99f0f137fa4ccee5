from __future__ import annotations

from typing import Any

import pytest

from domain.eligibility import (
    eligibility_records,
    is_truthy,
    task_route_eligibility,
    todos_task_id,
)
from domain.errors import ValidationError

OPTED_IN: dict[str, Any] = {"id": "task-1", "tags": ["auto:route"]}


def test_task_id_comes_from_data_id_task_id_or_nested_task() -> None:
    assert todos_task_id({"id": " t1 "}) == "t1"
    assert todos_task_id({"task_id": "t2"}) == "t2"
    assert todos_task_id({"taskId": "t3"}) == "t3"
    assert todos_task_id({"task": {"id": "t4"}}) == "t4"
    assert todos_task_id({"payload": {"id": "t5"}}) == "t5"


def test_a_missing_task_id_raises_the_upstream_message() -> None:
    with pytest.raises(ValidationError) as exc:
        todos_task_id({"title": "no id", "id": "  "})
    assert str(exc.value) == (
        "todos task event is missing task id in data.id, data.task_id, "
        "data.task.id, or data.payload.id"
    )


def test_an_opted_in_open_task_is_eligible() -> None:
    result = task_route_eligibility({**OPTED_IN, "status": "pending"}, {})
    assert result.eligible
    assert result.reason is None
    assert result.opted_in
    assert result.status == "pending"
    assert result.tags == ("auto:route",)


def test_a_task_without_opt_in_is_skipped() -> None:
    result = task_route_eligibility({"id": "task-1", "tags": "feature"}, {})
    assert not result.eligible
    assert result.reason == "missing explicit route opt-in"


@pytest.mark.parametrize(
    ("data", "metadata"),
    [
        ({"tags": "route:enabled"}, {}),
        ({"route_enabled": True}, {}),
        ({"routeEnabled": "true"}, {}),
        ({"task": {"metadata": {"automation_allowed": 1}}}, {}),
        ({"payload": {"task": {"automationAllowed": "1"}}}, {}),
        ({}, {"automation": {"allowed": True}}),
        ({"task": {"automation": {"allowed": "true"}}}, {}),
        ({}, {"task": {"metadata": {"tags": ["auto:route"]}}}),
        ({"metadata": {"route_enabled": " TRUE "}}, {}),
    ],
)
def test_each_opt_in_form_is_recognised(
    data: dict[str, Any], metadata: dict[str, Any]
) -> None:
    assert task_route_eligibility({"id": "t", **data}, metadata).opted_in


@pytest.mark.parametrize("value", [False, 0, "false", "yes", "0", None, 2, [True]])
def test_values_other_than_true_and_one_are_not_truthy(value: object) -> None:
    assert not is_truthy(value)
    data = {"id": "t", "route_enabled": value}
    assert task_route_eligibility(data, {}).reason == "missing explicit route opt-in"


def test_opt_in_tags_are_case_sensitive() -> None:
    result = task_route_eligibility({"id": "t", "tags": ["AUTO:ROUTE"]}, {})
    assert result.reason == "missing explicit route opt-in"


@pytest.mark.parametrize(
    "status",
    ["blocked", "completed", "done", "cancelled", "canceled", "failed", "archived"],
)
def test_a_terminal_or_blocked_status_is_not_routable(status: str) -> None:
    result = task_route_eligibility({**OPTED_IN, "status": status.upper()}, {})
    assert result.reason == f"task status is not routable: {status}"


def test_status_is_read_from_nested_task_fields() -> None:
    data = {**OPTED_IN, "task": {"task_status": "Done"}}
    assert (
        task_route_eligibility(data, {}).reason == "task status is not routable: done"
    )


def test_a_disallowed_tag_reports_the_first_such_tag_as_written() -> None:
    data = {"id": "t", "tags": ["auto:route", "feature", "Manual", "no-auto"]}
    result = task_route_eligibility(data, {})
    assert result.reason == "task has disallowed tag: Manual"


def test_disallowed_tags_in_envelope_metadata_count() -> None:
    result = task_route_eligibility(OPTED_IN, {"tags": "approval-required"})
    assert result.reason == "task has disallowed tag: approval-required"


@pytest.mark.parametrize(
    "field",
    [
        "no_auto",
        "noAuto",
        "manual",
        "manual_required",
        "manualRequired",
        "requires_approval",
        "requiresApproval",
        "approval_required",
        "approvalRequired",
    ],
)
def test_a_truthy_manual_gate_field_blocks_routing(field: str) -> None:
    result = task_route_eligibility({**OPTED_IN, "metadata": {field: "true"}}, {})
    assert result.reason == (
        f"task metadata requires manual or approval-gated handling: {field}"
    )


def test_a_manual_gate_on_an_automation_record_blocks_routing() -> None:
    metadata = {"automation": {"allowed": True, "requires_approval": True}}
    result = task_route_eligibility({"id": "t"}, metadata)
    assert result.reason == (
        "task metadata requires manual or approval-gated handling: requires_approval"
    )


def test_a_falsy_manual_gate_field_does_not_block() -> None:
    assert task_route_eligibility({**OPTED_IN, "manual": False}, {}).eligible


def test_checks_run_in_opt_in_status_tag_gate_order() -> None:
    everything = {
        "id": "t",
        "status": "done",
        "tags": ["manual"],
        "no_auto": True,
    }
    assert task_route_eligibility(everything, {}).reason == (
        "missing explicit route opt-in"
    )
    everything["route_enabled"] = True
    assert task_route_eligibility(everything, {}).reason == (
        "task status is not routable: done"
    )
    everything["status"] = "open"
    assert task_route_eligibility(everything, {}).reason == (
        "task has disallowed tag: manual"
    )
    everything["tags"] = []
    assert task_route_eligibility(everything, {}).reason == (
        "task metadata requires manual or approval-gated handling: no_auto"
    )


def test_the_record_union_covers_every_listed_location_once() -> None:
    automation = {"allowed": True}
    data = {
        "task": {"metadata": {"n": 1}},
        "payload": {"metadata": {"n": 2}, "task": {"metadata": {"n": 3}}},
        "metadata": {"n": 4},
    }
    metadata = {"task": {"metadata": {"n": 5}}, "automation": automation}
    records = eligibility_records(data, metadata)
    assert len(records) == 12
    assert sum(r is automation for r in records) == 1


def test_eligibility_to_dict_is_camel_case() -> None:
    result = task_route_eligibility({"id": "t", "tags": "x"}, {})
    assert result.to_dict() == {
        "eligible": False,
        "reason": "missing explicit route opt-in",
        "optedIn": False,
        "tags": ["x"],
    }
