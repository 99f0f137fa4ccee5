"""`--max-window-used off` (issue 41): the one validator takes it from argv, the item stores
it with its route and `routes show` prints it; other bad values are refused and write
nothing."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.models import WorkflowInvocation, WorkflowWorkItem
from tests.routing.helpers import todos_event

pytestmark = pytest.mark.django_db


def _route_task(task_id: str, *argv: str) -> None:
    call_command(
        "route_event",
        "todos-task",
        "--event-json",
        json.dumps(todos_event(task_id)),
        *argv,
        stdout=io.StringIO(),
    )


def _show(item_id: str, *argv: str) -> str:
    out = io.StringIO()
    call_command("routes", "show", item_id, *argv, stdout=out)
    return out.getvalue()


def test_off_is_stored_with_the_route_and_routes_show_prints_it() -> None:
    _route_task("task-w1", "--max-window-used", "off")
    item = WorkflowWorkItem.objects.get()
    assert item.route_options_json["options"]["max_window_used"] == "off"
    assert "  --max-window-used off" in _show(item.id).splitlines()
    assert json.loads(_show(item.id, "--json"))["maxWindowUsed"] == "off"


def test_the_default_is_not_recorded_and_routes_show_says_0_9() -> None:
    _route_task("task-w2")
    item = WorkflowWorkItem.objects.get()
    assert "max_window_used" not in item.route_options_json["options"]
    assert "--max-window-used" not in _show(item.id)
    assert json.loads(_show(item.id, "--json"))["maxWindowUsed"] == 0.9


@pytest.mark.parametrize("value", ["offf", "0", "1.5", "none"])
def test_a_bad_value_is_refused_and_writes_nothing(value: str) -> None:
    with pytest.raises(CommandError, match="--max-window-used must be .* or off"):
        _route_task("task-w3", "--max-window-used", value)
    assert WorkflowWorkItem.objects.count() == WorkflowInvocation.objects.count() == 0
