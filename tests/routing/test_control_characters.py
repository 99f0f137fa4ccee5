"""Event text never drives the operator's terminal (issue 43 item 5): control characters
are refused at ingest in ids, sources, types and task ids; titles keep their text; every
command that prints event-derived text escapes control characters; the admin shows step
output cleaned as /ops/ does. And the small ones of item 7: a closed pipe ends a command
quietly; `routes show` numbers every attempt."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from domain.controls import control_refused, terminal_lines, terminal_text
from ledger import services
from ledger.models import RunStatus
from routing.drains.inbox import IngestRejected, inbox_ingest
from routing.models import InboxEvent
from tests.ledger.runner_helpers import child_database_url
from tests.processes import MANAGE_PY, manage, scratch_cwd
from tests.routing.api.helpers import make_token, post_events
from tests.routing.helpers import generic_event, route, todos_event

pytestmark = pytest.mark.django_db

# OSC 52 (write the clipboard), a window title, a clear screen, and a C1 CSI.
HOSTILE = "\x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x07\x1b[2J\x9b2J"


def test_terminal_text_escapes_every_control_character_and_keeps_the_words() -> None:
    assert terminal_text("ok " + HOSTILE) == (
        "ok \\x1b]52;c;cHduZWQ=\\x07\\x1b]0;owned\\x07\\x1b[2J\\x9b2J"
    )
    assert terminal_text("a\nb\tc\x7f") == "a\\nb\\tc\\x7f"
    assert terminal_lines("a\nb\tc\r") == "a\nb\tc\\r"
    assert terminal_text("plain – ü") == "plain – ü"
    assert control_refused("event.id", "ok") is None
    assert control_refused("event.id", "a\nb") == (
        "event.id must not contain control characters (found '\\n')"
    )


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({**generic_event(), "id": "e" + HOSTILE}, "event.id"),
        ({**generic_event(), "source": "ci\n"}, "event.source"),
        ({**generic_event(), "type": "build\x1b[2J"}, "event.type"),
        ({**todos_event("t\x1b]0;x\x07"), "id": "evt-1"}, "the task id"),
    ],
)
def test_ingest_refuses_a_control_character_in_an_id_source_or_type(
    event: dict, field: str
) -> None:
    with pytest.raises(IngestRejected) as refused:
        inbox_ingest(enumerate([event], 1))
    (invalid,) = refused.value.report.invalid
    assert invalid["error"].startswith(f"{field} must not contain control characters")
    assert not InboxEvent.objects.exists()


def test_a_title_keeps_its_text(client) -> None:
    event = todos_event(title="Fix " + HOSTILE, description="line 1\nline 2")
    inbox_ingest(enumerate([event], 1))
    row = InboxEvent.objects.get()
    assert row.data["title"] == "Fix " + HOSTILE


def test_the_api_answers_400_naming_the_field(client) -> None:
    _, token = make_token("ingest")
    response = post_events(client, token, [{**generic_event(), "id": "e\x1b[2J"}])
    assert response.status_code == 400
    assert "event.id must not contain control characters" in json.dumps(response.json())
    assert not InboxEvent.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_drain_and_loop_list_print_a_stored_hostile_id_escaped() -> None:
    """A row stored before ids were checked: `manage.py drain`, `routes list` and `loop
    list` (real processes) print it with every escape written out, none raw."""
    inbox_ingest(enumerate([generic_event()], 1))
    InboxEvent.objects.update(event_id="evt" + HOSTILE)
    env = {**os.environ, "DATABASE_URL": child_database_url()}
    outputs = [
        manage(env, "drain", "generic").stdout,
        manage(env, "routes", "list").stdout,
        manage(env, "loop", "list").stdout,
    ]
    for out in outputs:
        assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out, out
        assert "evt\\x1b]52;" in out, out  # the loop name is cut short: still escaped


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_closed_pipe_ends_a_command_quietly() -> None:
    """`manage.py drain ... | head -0`: the reader is gone before the first line; the
    command stops without a traceback."""
    inbox_ingest(enumerate([generic_event() for _ in range(3)], 1))
    env = {**os.environ, "DATABASE_URL": child_database_url()}
    proc = subprocess.Popen(
        [
            sys.executable,
            MANAGE_PY,
            "drain",
            "generic",
            "--dry-run",
            "--max-dispatch",
            "3",
        ],
        cwd=scratch_cwd(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # nothing will read what it prints
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_routes_show_numbers_every_attempt_of_a_readmitted_item() -> None:
    result = route(event=generic_event())
    assert result.run is not None and result.work_item is not None
    services.run_claim(run_id=result.run.id, worker="w:1")
    services.run_finalize(run_id=result.run.id, status=RunStatus.FAILED, error="boom")
    call_command("routes", "retry", result.work_item.id, stdout=io.StringIO())
    out = io.StringIO()
    call_command("routes", "show", result.work_item.id, "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["workItem"]["attempts"] == 2
    assert [r["attempt"] for r in shown["runs"]] == [1, 2]
    text = io.StringIO()
    call_command("routes", "show", result.work_item.id, stdout=text)
    assert "attempt 1:" in text.getvalue() and "attempt 2:" in text.getvalue()


def test_route_event_refuses_a_hostile_id_with_one_line() -> None:
    with pytest.raises(CommandError, match="event.id must not contain control"):
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps({**generic_event(), "id": "x\x1b]0;t\x07"}),
            stdout=io.StringIO(),
        )
