from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from domain.readmission import (
    readmission_decision,
    redispatch_backoff,
)

NOW = datetime(2026, 7, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("attempts", "minutes"),
    [(0, 2), (1, 2), (2, 4), (3, 8), (4, 16), (5, 30), (8, 30), (40, 30)],
)
def test_backoff_doubles_from_two_minutes_up_to_thirty(
    attempts: int, minutes: int
) -> None:
    assert redispatch_backoff(attempts) == timedelta(minutes=minutes)


def test_a_finished_todos_task_item_past_its_backoff_is_readmitted() -> None:
    decision = readmission_decision(
        route_key="todos-task",
        status="failed",
        attempts=2,
        finished_at=NOW - timedelta(minutes=4),
        now=NOW,
    )
    assert decision.readmit
    assert decision.reason == (
        "re-admitted from failed: todos task still actionable after prior run "
        "(attempt 3/8)"
    )


def test_an_item_inside_its_backoff_keeps_deduping() -> None:
    decision = readmission_decision(
        route_key="todos-task",
        status="succeeded",
        attempts=2,
        finished_at=NOW - timedelta(minutes=3, seconds=59),
        now=NOW,
    )
    assert not decision.readmit


def test_the_redispatch_cap_keeps_deduping() -> None:
    decision = readmission_decision(
        route_key="todos-task",
        status="cancelled",
        attempts=8,
        finished_at=NOW - timedelta(days=1),
        now=NOW,
    )
    assert not decision.readmit


def test_an_unknown_finish_time_skips_the_backoff() -> None:
    decision = readmission_decision(
        route_key="todos-task",
        status="dead_letter",
        attempts=7,
        finished_at=None,
        now=NOW,
    )
    assert decision.readmit


@pytest.mark.parametrize("status", ["admitted", "running", "queued", "deferred"])
def test_non_terminal_items_are_never_readmitted(status: str) -> None:
    decision = readmission_decision(
        route_key="todos-task", status=status, attempts=1, finished_at=None, now=NOW
    )
    assert not decision.readmit


def test_generic_event_items_are_never_readmitted() -> None:
    decision = readmission_decision(
        route_key="generic-event",
        status="failed",
        attempts=1,
        finished_at=None,
        now=NOW,
    )
    assert not decision.readmit
