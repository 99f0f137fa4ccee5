"""The same event delivered 100 times at once, through the real HTTP server (issue 8).

Every delivery is a separate request on its own server thread and database connection, so
this exercises what a retrying producer or a webhook fan-out does: the inbox's uniqueness
and ingest lock, then admission under the admission lock. Expected: every request is a
202, exactly one reports the event accepted (and routed), one inbox row, one work item and
at most one run.

The server is Django's live server (the thread behind pytest-django's `live_server`) with
one change: a listen backlog of 256 instead of the dev server's 10. With 10, the kernel
resets most of a 100-connection burst before Django sees it (measured: 62 of 100), which
tests TCP, not loopsweb; production WSGI servers listen with far larger backlogs (gunicorn:
2048).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.core.servers.basehttp import ThreadedWSGIServer
from django.test.testcases import LiveServerThread, _StaticFilesHandler

from ledger.models import WorkflowRun, WorkflowWorkItem
from routing.models import InboxEvent
from tests.routing.api.helpers import make_token
from tests.routing.helpers import generic_event

DELIVERIES = 100
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class _BurstServer(ThreadedWSGIServer):
    request_queue_size = 256


class _BurstServerThread(LiveServerThread):
    server_class = _BurstServer


@pytest.fixture
def burst_server() -> Iterator[str]:
    """A live server that accepts a burst of connections; yields its base URL."""
    thread = _BurstServerThread("localhost", _StaticFilesHandler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    yield f"http://localhost:{thread.port}"
    thread.terminate()


def _deliver_at_once(url: str, token: str, body: bytes) -> list[tuple[int, Any]]:
    # All threads build their request, then wait at the barrier so the POSTs start together.
    barrier = threading.Barrier(DELIVERIES)

    def deliver(_: int) -> tuple[int, Any]:
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
            },
        )
        barrier.wait(timeout=60)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, error.read()[:500]

    with ThreadPoolExecutor(max_workers=DELIVERIES) as pool:
        return list(pool.map(deliver, range(DELIVERIES)))


def _one_event_delivered_100_times(base_url: str) -> None:
    _, token = make_token("ingest")
    event = generic_event()
    url = f"{base_url}/api/v1/events?route=now&max_active=5"
    answers = _deliver_at_once(url, token, json.dumps(event).encode())

    assert Counter(status for status, _ in answers) == {202: DELIVERIES}, answers[:3]
    winners = [body for _, body in answers if body["accepted"]]
    assert len(winners) == 1
    assert [r["kind"] for r in winners[0]["results"]] == ["created"]
    ref = {"source": event["source"], "id": event["id"]}
    assert all(
        body["duplicates"] == [ref] for _, body in answers if not body["accepted"]
    )

    row = InboxEvent.objects.get()
    item = WorkflowWorkItem.objects.get()
    assert row.state == "admitted" and row.work_item_id == item.id
    assert item.status == "admitted" and item.attempts == 1
    assert WorkflowRun.objects.count() <= 1
    assert WorkflowRun.objects.filter(work_item=item).count() == 1


@pytest.mark.postgres
def test_one_event_delivered_100_times_concurrently_on_postgresql(
    burst_server: str,
) -> None:
    _one_event_delivered_100_times(burst_server)


@pytest.mark.sqlite
def test_one_event_delivered_100_times_concurrently_on_sqlite(
    burst_server: str,
) -> None:
    # IMMEDIATE transactions serialise the writers; the 20 s busy timeout absorbs the queue.
    _one_event_delivered_100_times(burst_server)
