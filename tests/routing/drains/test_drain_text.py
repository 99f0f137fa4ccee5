"""`drain`'s text output (issue 29 items 7, 8): one line per result (kind, item, reason),
the counts, and a summary that says when --max-dispatch stopped the drain."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from routing.drains.inbox import inbox_ingest
from tests.routing.helpers import todos_event

pytestmark = pytest.mark.django_db


def _text(*args: str) -> list[str]:
    out = io.StringIO()
    call_command("drain", "todos-task", *args, stdout=out)
    return out.getvalue().splitlines()


def test_a_drain_admits_one_item_by_default_and_says_how_many_are_left() -> None:
    inbox_ingest(enumerate([todos_event(f"D-{n}") for n in range(8)], start=1))
    lines = _text()
    assert len(lines) == 3, lines
    assert lines[0].startswith("  created   task D-0: loop ")
    assert lines[1].startswith("drained inbox queue (todos-task, scope todos-task): ")
    assert "considered=1 created=1" in lines[1]
    assert (
        lines[2] == "1 admitted; --max-dispatch 1 stopped the drain, 7 candidates left"
    )


def test_each_result_has_its_line_with_kind_item_and_reason() -> None:
    inbox_ingest(
        enumerate(
            [
                todos_event("L-1"),
                todos_event("L-2", tags=[]),
                todos_event("L-3"),
            ],
            start=1,
        )
    )
    call_command("drain", "todos-task", "--max-dispatch", "1", stdout=io.StringIO())
    lines = _text("--max-dispatch", "5", "--max-active-per-project", "1")
    by_task = {line.split()[2].rstrip(":"): line for line in lines if "task " in line}
    assert by_task["L-2"] == "  skipped   task L-2: missing explicit route opt-in"
    assert by_task["L-3"] == (
        "  throttled task L-3: project active workflow limit reached (1/1)"
    )
    assert lines[-1] == "0 admitted"


def test_a_fatal_result_is_printed_before_the_error() -> None:
    inbox_ingest(enumerate([todos_event("X-1", project="/etc")], start=1))
    out = io.StringIO()
    with pytest.raises(CommandError, match="see the results above"):
        call_command("drain", "todos-task", stdout=out)
    [line] = [line for line in out.getvalue().splitlines() if "X-1" in line]
    assert line.startswith("  skipped   task X-1: error: ")
    assert "outside LOOPSWEB_PROJECT_ROOTS" in line
