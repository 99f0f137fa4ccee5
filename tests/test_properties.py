"""Property-based (hypothesis) tests over every input surface (issue 17, "must show"):
every management command's options, every query parameter of the API, the ops pages and the
admin lists. Whatever the input: no traceback (only CommandError from a command), no 5xx
(only 2xx-4xx, JSON on the API), and no partial write (a refused command or request leaves
every table as it was; a drain's own record of a refused drain is the one allowed row).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandError
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from routing.api.forms import INGEST_ROUTE_OPTIONS
from routing.api.tokens import api_token_create
from routing.drains.inbox import inbox_ingest
from tests.property_inputs import ARG_TEXT, NUMBERS, PROPERTY_SETTINGS, TEXT, VALUES
from tests.routing.api.helpers import row_counts
from tests.routing.helpers import generic_event, todos_event

pytestmark = pytest.mark.django_db


def _changed(before: dict[str, int], after: dict[str, int]) -> set[str]:
    return {table for table in before if before[table] != after[table]}


# --- management commands --------------------------------------------------------------------------

# Every command of our apps, found at run time: a new command is covered without a change here.
# But `qcluster`: django-q2's, which runs' only starts through runs.cluster_start; it runs
# a cluster until stopped (its start is tested through the processes, tests/test_run_clusters.py).
COMMANDS = {
    name: app
    for name, app in get_commands().items()
    if app in ("ledger", "runs", "routing") and name != "qcluster"
}
# Options whose values name things on this machine: drawn from prepared paths, not random
# text (random text would create directories, or run a program, in the working directory).
PATH_OPTIONS = {"--evidence-dir", "--event-file", "--lock-file"}
PATH_POSITIONALS = {"file"}
NEVER = {
    "--source-command",
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
}


def _parser(name: str) -> argparse.ArgumentParser:
    return load_command_class(COMMANDS[name], name).create_parser("manage.py", name)


def _value(draw: Any, action: argparse.Action, paths: list[str]) -> str:
    flag = action.option_strings[-1] if action.option_strings else action.dest
    if flag in PATH_OPTIONS or action.dest in PATH_POSITIONALS:
        return draw(st.sampled_from(paths))
    if action.dest == "kind":
        return draw(st.one_of(st.sampled_from(["generic", "todos-task"]), ARG_TEXT))
    if flag == "--source":
        return draw(st.sampled_from(["inbox", "command", "other"]))
    if flag == "--database":
        return draw(st.sampled_from(["default", "other"]))
    if action.choices:
        return draw(
            st.one_of(st.sampled_from(sorted(map(str, action.choices))), ARG_TEXT)
        )
    return draw(VALUES)


def _arguments(
    draw: Any, parser: argparse.ArgumentParser, paths: list[str]
) -> list[str]:
    argv: list[str] = []
    subcommands = None
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subcommands = action
        elif not action.option_strings and action.dest != "help":
            if action.nargs == "?" and draw(st.booleans()):
                continue
            argv.append(_value(draw, action, paths))
    options = [
        a
        for a in parser._actions
        if a.option_strings and not set(a.option_strings) & NEVER
    ]
    for action in (
        draw(st.lists(st.sampled_from(options), max_size=6, unique_by=lambda a: a.dest))
        if options
        else []
    ):
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        else:
            argv += [flag, _value(draw, action, paths)]
    if subcommands is not None:
        choice = draw(st.sampled_from(sorted(subcommands.choices)))
        argv += [choice, *_arguments(draw, subcommands.choices[choice], paths)]
    return argv


@st.composite
def command_lines(draw: Any, paths: list[str]) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    argv = [name, *_arguments(draw, _parser(name), paths)]
    if name == "lock_migrations" and "--lock-file" not in argv:
        argv += ["--lock-file", paths[2]]  # never the repository's own lock file
    return argv


@pytest.fixture
def paths(tmp_path: Path) -> list[str]:
    a_file = tmp_path / "event.json"
    a_file.write_text(json.dumps(generic_event()))
    bad_file = tmp_path / "bad.json"
    bad_file.write_bytes(b'{"id": "\xff", ')
    lock = tmp_path / "migrations.lock"
    lock.write_text("")
    return [
        str(a_file),
        str(bad_file),
        str(lock),
        str(tmp_path / "evidence"),
        str(tmp_path / "missing" / "x.json"),
        str(tmp_path),
        "/proc/loopsweb-nowhere",
        "/dev/null",
    ]


@PROPERTY_SETTINGS
@given(data=st.data())
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_no_command_line_ends_in_a_traceback_or_a_partial_write(
    data: st.DataObject, paths: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPSWEB_ADMIN_PASSWORD", "a-long-test-password")
    stdin = data.draw(
        st.sampled_from([b"", json.dumps(generic_event()).encode(), b"\xff{"])
    )
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    argv = data.draw(command_lines(paths))
    inbox_ingest(enumerate([generic_event(), todos_event()], start=1))
    before = row_counts()
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(*argv, stdout=out, stderr=err)
    except CommandError as exc:
        # A drain that ran and then failed (an item error, a refused evidence directory)
        # writes its outcome and record; any other refusal leaves every table as it was.
        ran = argv[0] == "drain" and str(exc).startswith(
            ("drain failed", "route drain hit")
        )
        if not ran:
            assert _changed(before, row_counts()) == set(), (argv, str(exc))
        return
    # It ran: it said what it did, with no traceback, and a dry run wrote nothing.
    said = out.getvalue() + err.getvalue()
    assert said.strip(), (argv, "a command that ran printed nothing")
    assert "Traceback" not in said, (argv, said)
    if "--dry-run" in argv:
        assert _changed(before, row_counts()) == set(), (argv, said)


# --- HTTP: the API, the ops pages, the admin lists --------------------------------------------------

API_PARAMS = {
    "/api/v1/work-items": [
        "status",
        "route_scope",
        "project",
        "reason_code",
        "account",
        "limit",
        "cursor",
    ],
    "/api/v1/drains": ["kind", "route_scope", "limit", "cursor"],
    "/api/v1/accounts": [],
    "/api/v1/work-items/x": [],
    "/api/v1/drains/x": [],
    "/metrics": [],
}
INGEST_PARAMS = [
    "route",
    "kind",
    *INGEST_ROUTE_OPTIONS,
]  # every route option the API takes
PAGE_PARAMS = {
    "/ops/": ["page"],
    "/ops/deferrals/": ["reason_code", "route_scope", "project_key", "page"],
    "/ops/deferrals/x/": ["page"],
    "/ops/accounts/": ["account", "page"],
    "/ops/drains/": ["kind", "route_scope", "page"],
    "/ops/drains/x/": [],
    "/admin/ledger/workflowworkitem/": [
        "q",
        "status__exact",
        "route_key",
        "route_scope",
        "project_key",
        "project_group",
        "source_kind",
        "subject_kind",
        "reason_code",
        "template_id",
        "account_profile",
        "provider",
        "age",
        "o",
        "p",
        "all",
        "e",
    ],
    "/admin/ledger/workflowrun/": [
        "q",
        "status__exact",
        "account_profile",
        "provider",
        "age",
        "o",
        "p",
    ],
    "/admin/ledger/workflowsteprun/": [
        "q",
        "status__exact",
        "account_profile",
        "provider",
        "age",
        "o",
        "p",
    ],
    "/admin/ledger/workflowevent/": ["q", "event_type", "age", "o", "p"],
}
PARAM_VALUES = st.one_of(
    TEXT,
    NUMBERS,
    st.sampled_from(
        ["now", "generic", "todos-task", "admitted", "deferred", "route_cap"]
    ),
)


def _query(names: list[str]) -> st.SearchStrategy[dict[str, str]]:
    keys = st.one_of(st.sampled_from(names), TEXT) if names else TEXT
    return st.dictionaries(keys, PARAM_VALUES, max_size=5)


@PROPERTY_SETTINGS
@given(data=st.data())
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_no_api_query_is_a_5xx_or_anything_but_json(data: st.DataObject) -> None:
    url = data.draw(st.sampled_from(sorted(API_PARAMS)))
    query = data.draw(_query(API_PARAMS[url]))
    _, token = api_token_create(
        name=f"p{row_counts()['routing_api_tokens']}", scopes=["read", "metrics"]
    )
    before = row_counts()
    response = Client().get(url, query, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code < 500, (url, query, response.content[:300])
    if url != "/metrics" or response.status_code != 200:
        response.json()  # JSON whatever the status
    after = row_counts()
    assert _changed(before, after) <= {"routing_api_tokens"}  # last_used_at only


@PROPERTY_SETTINGS
@given(data=st.data())
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_no_ingest_query_is_a_5xx_and_a_refused_one_stores_nothing(
    data: st.DataObject,
) -> None:
    query = data.draw(_query(INGEST_PARAMS))
    event = data.draw(
        st.sampled_from(
            [
                generic_event(),
                todos_event(),
                {"id": "x"},
                generic_event(project="/" + "p" * 3000),
            ]
        )
    )
    _, token = api_token_create(
        name=f"i{row_counts()['routing_api_tokens']}", scopes=["ingest"]
    )
    before = row_counts()
    url = "/api/v1/events?" + "&".join(f"{k}={v}" for k, v in [])
    response = Client().post(
        url + _urlencode(query),
        data=json.dumps(event),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code < 500, (query, response.content[:300])
    body = response.json()
    if response.status_code >= 400:
        assert "error" in body
        assert _changed(before, row_counts()) <= {"routing_api_tokens"}, query


def _urlencode(query: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return urlencode(query)


@PROPERTY_SETTINGS
@given(data=st.data())
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_no_ops_page_or_admin_list_query_is_a_5xx(
    data: st.DataObject, admin_client: Client
) -> None:
    url = data.draw(st.sampled_from(sorted(PAGE_PARAMS)))
    query = data.draw(_query(PAGE_PARAMS[url]))
    before = row_counts()
    response = admin_client.get(url, query)
    assert response.status_code < 500, (url, query)
    assert _changed(before, row_counts()) == set()
