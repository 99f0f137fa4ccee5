"""Property (hypothesis) over drain and schedule options (issue 28, must show): no generated
option value ever fails an inbox event. A drain either refuses its options before it reads a
candidate (every row as it was) or routes the valid events it takes (admitted, deferred or
skipped, never `failed`); creating a schedule never touches an inbox row."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from hypothesis import given
from hypothesis import strategies as st

from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from tests.routing.helpers import generic_event, todos_event
from tests.test_properties import ARG_TEXT, NUMBERS, PROPERTY_SETTINGS

pytestmark = pytest.mark.django_db

NEVER = {
    "--source",
    "--source-command",
    "--evidence-dir",
    "--help",
    "--version",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--skip-checks",
    "--no-color",
    "--force-color",
    "--verbosity",
    "-v",
    "--json",
}
# Long and hostile values: the ones that failed every candidate before options were checked.
HOSTILE = st.sampled_from(
    [
        "s" * 300,
        "n" * 600,
        "g" * 3000,
        "/srv/" + "p" * 3000,
        "/etc",
        "/srv/app",
        "required",
        "pr-review",
        "acctA,acctB",
        "a" * 201,
        "",
        " ",
    ]
)
# Mostly hostile values (a random one rarely overflows a column), then anything typed.
VALUES = st.one_of(HOSTILE, HOSTILE, HOSTILE, ARG_TEXT, NUMBERS)


def _options(command: str) -> list[Any]:
    parser = load_command_class("routing", command).create_parser("manage.py", command)
    return [
        a
        for a in parser._actions
        if a.option_strings and not set(a.option_strings) & NEVER
    ]


@st.composite
def option_lines(draw: Any, command: str) -> list[str]:
    argv: list[str] = []
    chosen = draw(
        st.lists(
            st.sampled_from(_options(command)),
            min_size=1,
            max_size=6,
            unique_by=lambda a: a.dest,
        )
    )
    for action in chosen:
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        else:
            argv += [flag, draw(VALUES)]
    return argv


def _inbox() -> list[tuple[str, str, int]]:
    return sorted(InboxEvent.objects.values_list("id", "state", "route_attempts"))


@PROPERTY_SETTINGS
@given(data=st.data())
def test_no_drain_option_fails_an_event(data: st.DataObject, tmp_path: Path) -> None:
    kind = data.draw(st.sampled_from(["generic", "todos-task"]))
    argv = data.draw(option_lines("drain"))
    inbox_ingest(
        enumerate([generic_event(), todos_event(), generic_event(), todos_event()], 1)
    )
    before = _inbox()
    try:
        call_command("drain", kind, *argv, stdout=io.StringIO(), stderr=io.StringIO())
    except CommandError as exc:
        if not str(exc).startswith(("drain failed", "route drain hit")):
            assert _inbox() == before, (argv, str(exc))
    states = set(InboxEvent.objects.values_list("state", flat=True))
    assert "failed" not in states, (kind, argv, list(InboxEvent.objects.values()))


@PROPERTY_SETTINGS
@given(data=st.data())
def test_no_schedule_option_touches_an_inbox_row(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["generic", "todos-task"]))
    name = data.draw(st.one_of(ARG_TEXT, HOSTILE))
    argv = data.draw(option_lines("schedule_drain"))
    inbox_ingest(enumerate([generic_event(), todos_event()], 1))
    before = _inbox()
    try:
        call_command(
            "schedule_drain",
            name,
            kind,
            *argv,
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    except CommandError:
        pass
    assert _inbox() == before
