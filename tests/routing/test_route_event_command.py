from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.models import WorkflowInvocation, WorkflowWorkItem
from tests.processes import manage
from tests.routing.helpers import generic_event, todos_event

pytestmark = pytest.mark.django_db


def _run(*args: str, stdin: str | None = None) -> dict:
    out = io.StringIO()
    if stdin is not None:
        call_command(
            "route_event", *args, "--json", stdout=out, stdin=io.StringIO(stdin)
        )
    else:
        call_command("route_event", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_json_output_carries_the_upstream_fields() -> None:
    event = todos_event("task-9")
    report = _run(
        "todos-task",
        "--event-json",
        json.dumps(event),
        "--auth-profile-pool",
        "a,b",
        "--max-active",
        "3",
    )
    assert (
        report["kind"] == "created" and report["idempotencyKey"] == "todos-task:task-9"
    )
    item = report["workItem"]
    assert (
        item["status"] == "admitted"
        and item["attempts"] == 1
        and item["routeScope"] == "todos-task"
    )
    assert (
        set(report["accountProfiles"]) == {"worker", "verifier"}
        and report["routeScope"] == "todos-task"
    )
    assert report["throttle"]["allowed"] is True and report["throttle"]["limits"] == {
        "maxActive": 3
    }

    again = _run("todos-task", "--event-json", json.dumps(event))
    assert again["kind"] == "deduped" and "reason" not in again


def test_throttled_output_has_reason_code_and_counts(tmp_path: Path) -> None:
    first = tmp_path / "e1.json"
    first.write_text(json.dumps(generic_event()))
    _run("generic", "--event-file", str(first), "--max-active", "1")
    second = tmp_path / "e2.json"
    second.write_text(json.dumps(generic_event()))
    report = _run("generic", "--event-file", str(second), "--max-active", "1")
    assert report["kind"] == "throttled" and report["reasonCode"] == "route_cap"
    assert report["reason"] == "scope generic-event active workflow limit reached (1/1)"
    assert report["workItem"]["lastReason"] == report["reason"]
    assert report["throttle"]["counts"] == {"global": 1, "project": 1}


def test_the_event_can_come_from_stdin() -> None:
    out = io.StringIO()
    call_command(
        "route_event",
        "generic",
        "--event-file",
        "-",
        stdout=out,
        stdin=io.StringIO(json.dumps(generic_event())),
    )
    assert out.getvalue().startswith("created ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--event-json", "{not json"], "event JSON is not valid JSON"),
        (["--event-json", "[1, 2]"], "event JSON must be an object"),
        (["--event-json", '{"type": "t", "source": "s"}'], "event.id is required"),
        (["--event-json", '{"id": "1", "source": "s"}'], "event.type is required"),
        (["--event-json", '{"id": "1", "type": "t"}'], "event.source is required"),
        (
            [
                "--event-json",
                '{"id": "1", "type": "t", "source": "s"}',
                "--max-active",
                "-1",
            ],
            "--max-active must be a positive integer",
        ),
        (
            [
                "--event-json",
                '{"id": "1", "type": "t", "source": "s"}',
                "--max-per-profile",
                "x",
            ],
            "--max-per-profile must be a non-negative integer",
        ),
        (
            [
                "--event-json",
                '{"id": "1", "type": "t", "source": "s"}',
                "--provider",
                "nope",
            ],
            "--provider must be one of",
        ),
        (["--event-json", "x" * (1024 * 1024 + 10)], "larger than"),
    ],
)
def test_bad_input_is_one_clear_error_and_writes_nothing(args, message) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        call_command("route_event", "generic", *args, stdout=io.StringIO())
    assert (
        WorkflowWorkItem.objects.count() == 0
        and WorkflowInvocation.objects.count() == 0
    )


def test_a_todos_event_without_a_task_id_is_refused() -> None:
    with pytest.raises(CommandError, match="todos task event is missing task id"):
        call_command(
            "route_event",
            "todos-task",
            "--event-json",
            json.dumps(generic_event()),
            stdout=io.StringIO(),
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_command_exits_non_zero_with_one_line_for_an_unknown_kind_and_bad_json() -> (
    None
):
    for args in (
        ["route_event", "bogus", "--event-json", "{}"],
        ["route_event", "generic", "--event-json", "{"],
    ):
        proc = manage(dict(os.environ), *args, check=False, timeout=60)
        assert proc.returncode != 0
        assert proc.stderr.strip() and len(proc.stderr.strip().splitlines()) <= 3, (
            proc.stderr
        )
