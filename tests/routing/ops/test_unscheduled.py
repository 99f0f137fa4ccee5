"""The console says what waits and whether anything will pick it up (issue 29 item 11):
no "Nothing is deferred" above deferred inbox events, no "Scheduled drains allow 0 active
runs" without a schedule, and a warning, with the `schedule_drain` command, when held or
pending inbox events have no schedule to drain them."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client

from routing.drains.inbox import inbox_ingest
from tests.routing.helpers import todos_event

pytestmark = pytest.mark.django_db

COMMAND = "python manage.py schedule_drain todos-task-drain todos-task --every 5m"


def _two_held() -> None:
    inbox_ingest(
        enumerate([todos_event(project="/srv/one") for _ in range(3)], start=1)
    )
    call_command(
        "drain",
        "todos-task",
        "--max-active-per-project",
        "1",
        "--max-dispatch",
        "5",
        stdout=io.StringIO(),
    )


def test_deferrals_never_says_nothing_is_deferred_above_deferred_inbox_events(
    admin_client: Client,
) -> None:
    _two_held()
    page = admin_client.get("/ops/deferrals/").content.decode()
    assert "Nothing is deferred" not in page
    assert "No work item is deferred; 2 inbox events are held by a drain" in page
    assert "Deferred inbox events (2)" in page
    assert (
        "2 held (deferred) inbox events wait and no drain schedule will pick them up"
        in page
    )
    assert COMMAND in page


def test_the_overview_says_no_drain_is_scheduled_and_warns_about_waiting_events(
    admin_client: Client,
) -> None:
    page = admin_client.get("/ops/").content.decode()
    assert "Scheduled drains allow" not in page
    assert "No drain is scheduled" in page
    assert "no drain schedule will pick" not in page  # nothing waits yet
    inbox_ingest(enumerate([todos_event()], start=1))
    page = admin_client.get("/ops/").content.decode()
    assert "1 pending inbox event waits and no drain schedule will pick it up" in page
    # No drain ran yet: the page cannot tell the kind, and says how to choose it.
    assert "python manage.py schedule_drain inbox-drain KIND --every 5m" in page
    assert "KIND is todos-task for task.* events, generic for the others" in page


def test_a_schedule_silences_the_warning_and_states_its_caps(
    admin_client: Client,
) -> None:
    _two_held()
    call_command(
        "schedule_drain",
        "todos-task-drain",
        "todos-task",
        "--every",
        "5m",
        "--max-active",
        "3",
        stdout=io.StringIO(),
    )
    overview = admin_client.get("/ops/").content.decode()
    assert "no drain schedule will pick" not in overview
    assert "Scheduled drains allow 3 active runs" in overview
    deferrals = admin_client.get("/ops/deferrals/").content.decode()
    assert "no drain schedule will pick" not in deferrals
