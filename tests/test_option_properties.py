"""Property (hypothesis) over drain and schedule options (issue 28, must show): no generated
option value ever fails an inbox event. A drain either refuses its options before it reads a
candidate (every row as it was) or routes the valid events it takes (admitted, deferred or
skipped, never `failed`); creating a schedule never touches an inbox row."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from hypothesis import given
from hypothesis import strategies as st

from routing.api.forms import INGEST_ROUTE_OPTIONS, IngestQueryForm, api_words
from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from tests.property_inputs import ARG_TEXT, NUMBERS, PROPERTY_SETTINGS
from tests.routing.helpers import generic_event, todos_event

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
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
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


# Values that only some entry points used to refuse (issue 43): the sandbox no event can
# pass without break-glass, and scopes or names carrying a newline or an escape sequence.
REFUSED_SOMEWHERE = st.sampled_from(
    ["danger-full-access", "a\nb", "\x1b]52;c;aGk=\x07", "\x1b[2J", "ok\x9b", "t\x7f"]
)


@st.composite
def route_option_lines(draw: Any) -> list[tuple[str, str]]:
    """Route options (flag, value) that `route_event`, `drain`, `schedule_drain` and the
    ingest API all take."""
    shared = [
        a
        for a in _options("route_event")
        if a.nargs != 0 and a.dest in INGEST_ROUTE_OPTIONS
    ]
    chosen = draw(
        st.lists(
            st.sampled_from(shared), min_size=1, max_size=4, unique_by=lambda a: a.dest
        )
    )
    values = st.one_of(REFUSED_SOMEWHERE, VALUES)
    return [(a.option_strings[-1], draw(values)) for a in chosen]


def _refusal(command: str, *argv: str) -> str | None:
    try:
        call_command(command, *argv, stdout=io.StringIO(), stderr=io.StringIO())
    except CommandError as exc:
        return str(exc)
    return None


@PROPERTY_SETTINGS
@given(pairs=route_option_lines())
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_every_entry_point_refuses_the_same_options_alike(
    pairs: list[tuple[str, str]],
) -> None:
    """One validator: the same options are accepted by all four entry points, or refused
    by all four with the same message (the API's in its own parameter names), and a
    refusal writes nothing."""
    argv = [part for pair in pairs for part in pair]
    before = _inbox()
    drain = _refusal("drain", "generic", "--dry-run", *argv)
    schedule = _refusal(
        "schedule_drain", "s1", "generic", "--every", "5m", "--dry-run", *argv
    )
    routed = _refusal(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(generic_event()),
        "--dry-run",
        *argv,
    )
    query = {flag.lstrip("-").replace("-", "_"): value for flag, value in pairs}
    form = IngestQueryForm(data={"route": "now", "kind": "generic", **query})
    api = None if form.is_valid() else form.first_error()
    assert drain == schedule, (pairs, drain, schedule)
    if drain is not None:
        assert routed == drain, (pairs, routed, drain)
        assert api == api_words(drain), (pairs, api, drain)
    else:
        assert api is None, (pairs, api)
        assert routed is None or not routed.startswith("--"), (pairs, routed)
    assert _inbox() == before
