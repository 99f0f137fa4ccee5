"""Notifications with the processes `make run` starts (docs/operations.md "Notifications"):
LOOPSWEB_NOTIFY_URL names a receiver this test runs on 127.0.0.1; a second terminal routes
an event (`manage.py route_event`) whose run fails for good (the fake agent exits 3, one
attempt), and the receiver gets exactly one message for it, with its `text`: recorded by
the run cluster when the run ended, posted by the main cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.models import Notification, NotificationState, RunStatus, WorkflowRun
from tests.ledger.runner_helpers import start_installation
from tests.notify_receiver import Receiver
from tests.processes import (
    free_port,
    generic_event,
    manage,
    stop_make_run,
    wait_for_http,
    wait_until,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.xdist_group("installation"),
]


def test_a_run_that_fails_for_good_reaches_the_receiver_once(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    receiver = Receiver()
    port = free_port()
    env, log, proc = start_installation(
        tmp_path,
        port,
        FAKE_AGENT_SLEEP="0",
        FAKE_AGENT_EXIT="3",
        LOOPSWEB_NOTIFY_URL=receiver.url,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/admin/login/", timeout=90)
        event = generic_event(project, 1)
        event_file = tmp_path / "event.json"
        event_file.write_text(json.dumps(event))
        manage(env, "route_event", "generic", "--event-file", str(event_file))
        run = wait_until(
            lambda: WorkflowRun.objects.filter(status=RunStatus.FAILED).first(),
            timeout=120,
            what="the routed event's run to fail",
        )
        wait_until(
            lambda: receiver.messages,
            timeout=120,
            what="the receiver to get the run's notification",
        )
        row = wait_until(
            lambda: Notification.objects.filter(state=NotificationState.SENT).first(),
            timeout=60,
            what="the notification to be marked sent",
        )
    finally:
        stop_make_run(proc)
        receiver.close()
    output = log.read_text(errors="replace")
    assert "Traceback" not in output, output[-3000:]

    # Sent is final (runs.notifications): the one row was posted once.
    (message,) = receiver.messages
    assert message["content_type"] == "application/json"
    body = message["body"]
    assert body["kind"] == "run_failed" and body["details"]["runId"] == run.id
    assert (
        body["text"].startswith("Run failed for good") and event["id"] in body["text"]
    )
    assert Notification.objects.count() == 1
    assert (row.kind, row.attempts) == ("run_failed", 1)
