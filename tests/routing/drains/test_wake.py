"""Arriving events wake the drain schedules that take them (routing/drains/wake.py): which
schedules, how often, what the woken drain does. The processes `make run` starts, a second
terminal's `ingest_events` and the run to its first step: tests/test_drain_wake_process.py."""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from django_q.models import OrmQ, Schedule
from django_q.signing import SignedPackage

from ledger.models import WorkflowWorkItem
from routing.api.tokens import api_token_create
from routing.drains.inbox import inbox_ingest
from routing.drains.wake import WOKEN_FUNC, drain_wake_again, drains_wake
from routing.models import DrainWake, InboxEvent
from routing.tasks import drain_woken
from tests.routing.helpers import generic_event, todos_event

pytestmark = pytest.mark.django_db
SECOND = timedelta(seconds=1)


def _schedule(name: str, kind: str, *extra: str) -> None:
    call_command(
        "schedule_drain",
        name,
        kind,
        "--every",
        "60m",
        "--max-active",
        "5",
        *extra,
        stdout=io.StringIO(),
    )


def _woken() -> list[tuple[str, datetime]]:
    """(schedule, visible from) of each queued wake-up task, oldest first."""
    out = []
    for row in OrmQ.objects.order_by("id"):
        task = SignedPackage.loads(row.payload)
        if task["func"] == WOKEN_FUNC:
            out.append((task["args"][0], row.lock))
    return out


@pytest.fixture
def schedules() -> None:
    _schedule("gen", "generic")
    _schedule("todo", "todos-task")
    _schedule("gen-paused", "generic")
    Schedule.objects.filter(name="gen-paused").update(repeats=0)
    # Reads a source command, never the inbox: never woken.
    _schedule("gen-cmd", "generic", "--source", "command", "--source-command", "true")


def test_an_event_wakes_the_schedules_of_its_kind_at_most_once_per_spacing(
    schedules: None,
) -> None:
    t0 = timezone.now()
    assert drains_wake(["build.failed"], now=t0) == ["gen"]
    assert drains_wake(["task.created", "build.failed"], now=t0) == ["todo"]
    # Committed before the queued drain is due: that drain sees it, nothing more queued.
    assert drains_wake(["build.failed"], now=t0) == []
    # After it: the next drain, a spacing after the last one.
    assert drains_wake(["build.failed"], now=t0 + SECOND / 10) == ["gen"]
    assert drains_wake(["build.failed"], now=t0 + SECOND / 2) == []
    assert drains_wake(["build.failed"], now=t0 + 3 * SECOND) == ["gen"]
    assert DrainWake.objects.get(schedule="gen").due_at == t0 + 3 * SECOND
    woken = _woken()
    assert [name for name, _ in woken] == ["gen", "todo", "gen", "gen"]
    # The second one of "gen" becomes visible when it is due, most of a second later.
    assert woken[2][1] >= woken[0][1] + SECOND / 2


def test_no_wake_ups_when_the_spacing_is_zero(schedules: None, settings: Any) -> None:
    settings.LOOPSWEB_INGEST_WAKE_SECONDS = 0
    assert drains_wake(["build.failed", "task.created"]) == []
    assert _woken() == [] and not DrainWake.objects.exists()


def test_ingest_wakes_once_it_commits_but_not_a_dry_run_nor_route_now(
    schedules: None, client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        inbox_ingest([("1", generic_event())], dry_run=True)
    assert _woken() == []
    with django_capture_on_commit_callbacks(execute=True):
        inbox_ingest([("1", generic_event()), ("2", todos_event())])
    assert sorted(name for name, _ in _woken()) == ["gen", "todo"]

    OrmQ.objects.all().delete()
    DrainWake.objects.all().delete()
    _, token = api_token_create(name="wake", scopes=["ingest"])
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    body = json.dumps([generic_event(project="/srv/app")])
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(
            "/api/v1/events?route=now",
            body,
            content_type="application/json",
            **headers,
        )
    assert answer.status_code == 202, answer.content
    assert _woken() == []  # routed in the request
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(
            "/api/v1/events",
            json.dumps([generic_event(project="/srv/app")]),
            content_type="application/json",
            **headers,
        )
    assert answer.status_code == 202, answer.content
    assert [name for name, _ in _woken()] == ["gen"]


def test_a_woken_drain_runs_its_schedules_drain_as_the_schedule_is_now(
    schedules: None,
) -> None:
    inbox_ingest([("1", generic_event(project="/srv/app"))])
    result = drain_woken("gen")
    assert result is not None and result["created"] == 1, result
    assert WorkflowWorkItem.objects.get().route_scope == "gen"
    assert InboxEvent.objects.get().state == "admitted"
    assert drain_woken("gen-paused") is None
    call_command("schedule_drain", "--delete", "gen", stdout=io.StringIO())
    assert drain_woken("gen") is None
    assert not DrainWake.objects.filter(schedule="gen").exists()


def test_a_woken_drain_that_steps_aside_wakes_its_schedule_again(
    schedules: None,
) -> None:
    now = timezone.now()
    assert drain_wake_again("gen", now=now)
    assert DrainWake.objects.get(schedule="gen").due_at == now + SECOND
    [(name, visible)] = _woken()
    assert name == "gen" and visible >= now + SECOND
    assert not drain_wake_again("gen-paused", now=now)
    assert not drain_wake_again("nothing", now=now)


@pytest.mark.django_db(transaction=True)
def test_a_wake_up_the_database_refuses_costs_the_ingest_nothing(
    schedules: None, client: Any, caplog: Any
) -> None:
    """The events are stored and the API answers 202; one warning says the schedules will
    take them (the wake-up's table is renamed away: a real database error)."""
    _, token = api_token_create(name="wake", scopes=["ingest"])
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE routing_drain_wakes RENAME TO routing_drain_wakes_x"
        )
    try:
        answer = client.post(
            "/api/v1/events",
            json.dumps([generic_event(project="/srv/app")]),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER TABLE routing_drain_wakes_x RENAME TO routing_drain_wakes"
            )
    assert answer.status_code == 202, answer.content
    assert InboxEvent.objects.count() == 1 and _woken() == []
    assert "did not wake the drains" in caplog.text
