"""The provider stand-in's slow and hang modes, per API key (the real CLIs use the others in
tests/agents/test_real_clis.py)."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from tests.agents.provider import ProviderStandIn
from tests.waiting import hang_deadline, wait_for

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


def _window_post(server: ProviderStandIn, key: str) -> tuple[int, str, str]:
    """(status, the 5-hour used percent header, its reset) of one model call of `key`."""
    response = _post(server, key, timeout=hang_deadline(120))
    response.read()
    return (
        response.status,
        response.getheader("x-codex-primary-used-percent") or "",
        response.getheader("x-codex-primary-reset-at") or "",
    )


def test_a_growing_window_refuses_past_100_percent_until_it_resets() -> None:
    server = ProviderStandIn(
        window_step=0.5, window_reset_seconds=2, windows={"k": 0.0, "other": 0.0}
    )
    server.start()
    try:
        first = _window_post(server, "k")
        assert first[:2] == (200, "50.0")
        assert _window_post(server, "k")[:2] == (200, "100.0")
        refused = _window_post(server, "k")
        assert refused[:2] == (429, "100.0") and refused[2] == first[2]
        assert [r.refused for r in server.requests] == [None, None, 429]
        assert _window_post(server, "other")[:2] == (200, "50.0")  # per key
        # The window resets: every key back to 0, the next reset later than the first.
        wait_for(lambda: server.window_of("k") == 0.0, what="the window's reset")
        again = _window_post(server, "k")
        assert again[:2] == (200, "50.0") and int(again[2]) > int(first[2])
        assert server.window_of("other") == 0.0
    finally:
        server.stop()
