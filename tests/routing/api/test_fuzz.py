"""Hostile input never causes a 500 or a partial write (issue 8, property-based).

Malformed, oversized, deeply nested, wrong-typed and non-UTF-8 bodies go to the ingest
endpoint and to the `ingest_events` and `route_event` commands. The properties:
- the endpoint answers 202 or a JSON 4xx (the test client re-raises any exception a 500
  would come from, so hypothesis shrinks it to a minimal body);
- the commands succeed or raise CommandError, nothing else;
- a refusal leaves every table's row count unchanged; an acceptance adds exactly the inbox
  rows it reports.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.routing.api.helpers import EVENTS_URL, bearer, make_token, row_counts

pytestmark = pytest.mark.django_db

INBOX = "routing_inbox_events"
BODY_LIMIT = 4096  # small, so oversized bodies stay cheap to generate
FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,  # no replay store: every run explores afresh, nothing left in the tree
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Strings that break storage rather than parsing: NUL, lone surrogates, and lengths past
# the varchar columns (id 500, type/source 200, time 64).
awkward_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "   ", "\x00", "a\x00b", "\ud800", "x\udfffy", "é", "🙂"]),
    st.integers(min_value=60, max_value=700).map(lambda n: "x" * n),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    awkward_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(awkward_text, inner, max_size=4)
    ),
    max_leaves=12,
)
wrong_typed = st.one_of(
    st.integers(), st.none(), st.lists(scalars, max_size=2), awkward_text
)
envelopes = st.fixed_dictionaries(
    {
        "id": st.one_of(st.text(min_size=1, max_size=12), wrong_typed),
        "type": st.one_of(
            st.sampled_from(["task.created", "build.failed"]), wrong_typed
        ),
        "source": st.one_of(st.sampled_from(["ci", "@hasna/todos"]), wrong_typed),
    },
    optional={
        "data": json_values,
        "metadata": json_values,
        "subject": json_values,
        "time": json_values,
    },
)
# Mostly ordinary text, sometimes awkward: enough clean envelopes get all the way through.
field_text = st.one_of(st.text(max_size=20), st.text(max_size=20), awkward_text)
# Well-formed envelopes with awkward contents: these get past parsing, into storage and
# routing (project paths, groups, pools, task ids), where the subtler failures live.
plausible = st.fixed_dictionaries(
    {
        "id": st.one_of(st.text(min_size=1, max_size=16), awkward_text),
        "type": st.sampled_from(["task.created", "build.failed"]),
        "source": st.sampled_from(["ci", "@hasna/todos"]),
        "data": st.fixed_dictionaries(
            {},
            optional={
                "id": field_text,
                "tags": st.one_of(st.just(["auto:route"]), json_values),
                "project_path": field_text,
                "project_group": field_text,
                "title": field_text,
                "auth_profile_pool": field_text,
                "pr_fingerprint": field_text,
            },
        ),
    },
    optional={"metadata": json_values, "subject": field_text, "time": field_text},
)
documents = st.one_of(
    plausible,
    st.lists(plausible, min_size=1, max_size=4),
    envelopes,
    st.lists(envelopes, max_size=4),
    json_values,
)


def _encode(value: Any, ascii_only: bool) -> bytes:
    text = json.dumps(value, ensure_ascii=ascii_only)
    # Unpaired surrogates cannot be UTF-8: "surrogatepass" writes them anyway (CESU-style
    # bytes), which is exactly the non-UTF-8 input a sloppy producer sends.
    return text.encode("utf-8", "surrogatepass")


@st.composite
def nested(draw: st.DrawFn) -> bytes:
    # Mostly within the body limit (so the depth check, not the size check, refuses them),
    # sometimes far past it.
    depth = draw(st.one_of(st.integers(20, 600), st.integers(600, 50_000)))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    body = opener * depth + b"1" + closer * draw(st.integers(0, depth))
    return body


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    body = _encode(draw(documents), draw(st.booleans()))
    cut = draw(st.integers(min_value=0, max_value=len(body)))
    mutation = draw(st.sampled_from(["truncate", "flip", "inject", "constant"]))
    if mutation == "truncate":
        return body[:cut]
    if mutation == "flip":
        return body[:cut] + bytes([draw(st.integers(0, 255))]) + body[cut + 1 :]
    if mutation == "inject":
        return (
            body[:cut]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80"]))
            + body[cut:]
        )
    return (
        body[:cut]
        + draw(st.sampled_from([b"NaN", b"-Infinity", b"1e999"]))
        + body[cut:]
    )


@st.composite
def oversized(draw: st.DrawFn) -> bytes:
    size = draw(st.integers(min_value=BODY_LIMIT - 200, max_value=BODY_LIMIT * 3))
    envelope = {"id": "big", "type": "t", "source": "s", "data": {"pad": "p" * size}}
    return json.dumps(envelope).encode()


bodies = st.one_of(
    st.builds(_encode, documents, st.booleans()),
    st.builds(_encode, documents, st.booleans()),
    corrupted(),
    nested(),
    oversized(),
    st.binary(max_size=300),
)


def _envelope_bytes(**fields: Any) -> bytes:
    envelope = {"id": "e-1", "type": "build.failed", "source": "ci", "data": {}}
    envelope.update(fields)
    return json.dumps(envelope).encode()


# Always-run examples: values that fit JSON but not a ledger column or a PostgreSQL string.
# Random search reaches them only now and then; a regression must fail on every run.
LONG_ID = _envelope_bytes(id="x" * 600)
LONG_GROUP = _envelope_bytes(data={"project_group": "g" * 300, "id": "t-1"})
LONG_TYPE = _envelope_bytes(type="t" * 300)
NUL_IN_DATA = _envelope_bytes(data={"note": "a\x00b"})  # json.dumps writes \u0000


def _assert_nothing_or_exactly_reported(
    before: dict[str, int], accepted: int | None
) -> None:
    after = row_counts()
    if accepted is None:
        assert after == before
        return
    assert after[INBOX] == before[INBOX] + accepted
    # Without route=now, ingest touches no other table.
    assert {k: v for k, v in after.items() if k != INBOX} == {
        k: v for k, v in before.items() if k != INBOX
    }


@pytest.fixture
def ingest_token() -> str:
    return make_token("ingest")[1]


@FUZZ
@example(body=LONG_ID, route_now=True, content_type="application/json")
@example(body=LONG_GROUP, route_now=True, content_type="application/json")
@example(body=NUL_IN_DATA, route_now=False, content_type="application/json")
@given(
    body=bodies,
    route_now=st.booleans(),
    # Other content types are a plain 415 (test_api_ingest); here every body gets parsed.
    content_type=st.sampled_from(
        ["application/json", "application/json; charset=utf-8"]
    ),
)
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_the_ingest_endpoint_never_fails_or_half_writes(
    ingest_token: str, body: bytes, route_now: bool, content_type: str
) -> None:
    client = Client(raise_request_exception=True)
    before = row_counts()
    with override_settings(LOOPSWEB_MAX_EVENT_BYTES=BODY_LIMIT):
        response = client.post(
            EVENTS_URL + ("?route=now" if route_now else ""),
            data=body,
            content_type=content_type,
            **bearer(ingest_token),
        )
    # --hypothesis-show-statistics shows how the examples spread over the outcomes.
    event(f"HTTP {response.status_code}")
    assert response.status_code in (202, 400, 413, 415), response.content[:200]
    assert response["Content-Type"] == "application/json"
    answer = response.json()
    if response.status_code != 202:
        assert isinstance(answer["error"], str) and answer["error"]
        _assert_nothing_or_exactly_reported(before, None)
    elif route_now:
        assert row_counts()[INBOX] == before[INBOX] + len(answer["accepted"])
        assert len(answer["results"]) == len(answer["accepted"])
    else:
        _assert_nothing_or_exactly_reported(before, len(answer["accepted"]))


@FUZZ
@example(body=LONG_TYPE, skip_invalid=False)
@example(body=NUL_IN_DATA, skip_invalid=True)
@given(body=bodies, skip_invalid=st.booleans())
def test_ingest_events_never_crashes_or_half_writes(
    body: bytes, skip_invalid: bool
) -> None:
    before = row_counts()
    out = io.StringIO()
    args = [
        "ingest_events",
        "-",
        "--json",
        *(["--skip-invalid"] if skip_invalid else []),
    ]
    with override_settings(LOOPSWEB_MAX_EVENT_BYTES=BODY_LIMIT):
        try:
            call_command(
                *args, stdin=io.BytesIO(body), stdout=out, stderr=io.StringIO()
            )
        except CommandError:
            event("refused")
            _assert_nothing_or_exactly_reported(before, None)
            return
    event("stored")
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    _assert_nothing_or_exactly_reported(before, report["new"])
    if not skip_invalid:
        assert report["invalid"] == 0


@FUZZ
@example(body=LONG_ID, kind="generic", via_stdin=True)
@example(body=LONG_GROUP, kind="todos-task", via_stdin=False)
@example(body=NUL_IN_DATA, kind="generic", via_stdin=True)
@given(
    # Single plausible envelopes weigh more here: route_event takes one object, and those
    # are the bodies that reach planning and the admission transaction.
    body=st.one_of(st.builds(_encode, plausible, st.just(True)), bodies),
    kind=st.sampled_from(["generic", "todos-task"]),
    via_stdin=st.booleans(),
)
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_route_event_never_crashes_or_half_writes(
    body: bytes, kind: str, via_stdin: bool
) -> None:
    before = row_counts()
    if via_stdin:
        args = ["--event-file", "-"]
        stdin: io.BytesIO | None = io.BytesIO(body)
    else:
        # argv carries undecodable bytes as lone surrogates (PEP 383), as a shell would.
        args = ["--event-json", body.decode("utf-8", "surrogateescape")]
        stdin = None
    with override_settings(LOOPSWEB_MAX_EVENT_BYTES=BODY_LIMIT):
        try:
            call_command(
                "route_event",
                kind,
                *args,
                "--json",
                stdin=stdin,
                stdout=io.StringIO(),
                stderr=io.StringIO(),
            )
        except CommandError:
            event("refused")
            assert row_counts() == before
            return
    event("routed")


@pytest.fixture
def read_token() -> str:
    return make_token("read", "metrics")[1]


def _forged_cursor(row_id: str) -> str:
    raw = json.dumps(["2026-01-01T00:00:00+00:00", row_id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


query_values = st.one_of(
    awkward_text,
    st.integers(-5, 500).map(str),
    awkward_text.map(_forged_cursor),
)


@FUZZ
@given(
    path=st.sampled_from(
        ["/api/v1/work-items", "/api/v1/drains", "/api/v1/accounts", "/metrics"]
    ),
    query=st.dictionaries(
        st.sampled_from(
            ["status", "route_scope", "project", "reason_code", "account", "kind"]
            + ["cursor", "limit", "bogus"]
        ),
        query_values,
        max_size=4,
    ),
    detail=st.one_of(st.none(), awkward_text.filter(lambda t: t and "/" not in t)),
)
def test_read_endpoints_answer_4xx_json_never_500(
    read_token: str, path: str, query: dict[str, str], detail: str | None
) -> None:
    client = Client(raise_request_exception=True)
    url = path
    if detail is not None and path in ("/api/v1/work-items", "/api/v1/drains"):
        url = f"{path}/{quote(detail, safe='', errors='surrogatepass')}"
    # Surrogates cannot be percent-encoded as UTF-8; send their CESU bytes like a bad client.
    encoded = urlencode(
        {k: v.encode("utf-8", "surrogatepass") for k, v in query.items()}
    )
    response = client.get(f"{url}?{encoded}", **bearer(read_token))
    event(f"HTTP {response.status_code}")
    assert response.status_code in (200, 400, 404), response.content[:200]
    if response.status_code != 200 or path != "/metrics":
        assert isinstance(response.json(), dict)
