"""The provider stand-in's slow and hang modes, per API key (the real CLIs use the others in
tests/agents/test_real_clis.py)."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from tests.agents.provider import ProviderStandIn
from tests.waiting import hang_deadline

# No database here: one suite (SQLite's) runs it, not again on PostgreSQL.
pytestmark = [pytest.mark.slow, pytest.mark.sqlite]

BODY = json.dumps(
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
)


def _post(
    server: ProviderStandIn, key: str, timeout: float
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=BODY,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    return conn.getresponse()


def test_slow_streams_deltas_for_its_seconds_and_hang_never_answers() -> None:
    server = ProviderStandIn(slow_seconds=2, modes={"slow": "slow", "hung": "hang"})
    server.start()
    try:
        started = time.monotonic()
        response = _post(server, "slow", timeout=hang_deadline(120))
        assert response.status == 200
        first = response.readline()
        body = first + response.read()
        # It streamed for its seconds (at least) and then ended by itself.
        assert time.monotonic() - started >= 1.5
        assert body.count(b'"content": "thinking') >= 3
        assert b"[DONE]" in body
        with pytest.raises((socket.timeout, TimeoutError)):
            _post(server, "hung", timeout=1.5)
        assert [r.mode for r in server.requests] == ["slow", "hang"]
        assert [r.key for r in server.requests] == ["slow", "hung"]
        response = _post(server, "other", timeout=hang_deadline(120))
        assert response.status == 200 and b"[DONE]" in response.read()
    finally:
        server.stop()
