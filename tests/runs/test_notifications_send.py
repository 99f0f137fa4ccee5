"""Notifications delivered (runs.notifications, docs/operations.md "Notifications"), to a
real HTTP receiver on 127.0.0.1: a 2xx answer marks the row sent; a 500 is tried again after
the backoff with its attempts counted; a receiver that cannot be reached is tried with a
doubling backoff, then the row is failed, and /ops/ says so; the sweep queues what is due."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from ledger.models import Notification, NotificationState
from ledger.services import notifications as notes
from ledger.services import notify
from runs import notifications as delivery
from runs.tasks import notifications_send
from tests.notify_receiver import TOKEN_PATH, Receiver, unreachable_url
from tests.processes import scratch_cwd

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    found = Receiver()
    settings.LOOPSWEB_NOTIFY_URL = found.url
    yield found
    found.close()


def _told(kind: str = "run_failed", episode: str = "item-1:1") -> Notification:
    assert notify(kind, episode, f"{kind}: {episode}", {"workItemId": "item-1"})
    return Notification.objects.get(kind=kind, episode=episode)


def test_a_2xx_answer_marks_the_row_sent(receiver: Receiver) -> None:
    row = _told()

    assert notifications_send(row.id) == delivery.SENT

    row.refresh_from_db()
    assert row.state == NotificationState.SENT and row.sent_at is not None
    assert row.attempts == 1 and row.last_error is None
    (message,) = receiver.messages
    assert message["path"] == TOKEN_PATH
    assert message["content_type"] == "application/json"
    body = message["body"]
    assert body["text"] == "run_failed: item-1:1"
    assert (body["kind"], body["episode"]) == ("run_failed", "item-1:1")
    assert body["details"] == {"workItemId": "item-1"}
    assert body["notificationId"] == row.id
    # Sent is sent: a second delivery of the task posts nothing.
    assert notifications_send(row.id) == delivery.NOT_DUE
    assert len(receiver.messages) == 1


def test_a_500_is_tried_again_after_the_backoff(receiver: Receiver) -> None:
    receiver.statuses = [500]
    row = _told()
    now = timezone.now()

    assert delivery.notification_deliver(row.id, now=now) == delivery.RETRY
    row.refresh_from_db()
    assert row.state == NotificationState.PENDING and row.attempts == 1
    assert row.last_error == "HTTP 500"
    assert row.next_attempt_at == now + timedelta(seconds=delivery.BACKOFF_FIRST)
    # Its next try is queued, visible only then (the broker's lock).
    (task,) = OrmQ.objects.all()
    assert SignedPackage.loads(task.payload)["args"] == (row.id,)
    assert task.lock > now + timedelta(seconds=delivery.BACKOFF_FIRST - 1)

    # Not due yet: nothing is posted.
    assert delivery.notification_deliver(row.id, now=now) == delivery.NOT_DUE
    later = now + timedelta(seconds=delivery.BACKOFF_FIRST + 1)
    assert delivery.notification_deliver(row.id, now=later) == delivery.SENT
    row.refresh_from_db()
    assert row.state == NotificationState.SENT and row.attempts == 2
    assert row.last_error is None
    assert receiver.texts() == ["run_failed: item-1:1"] * 2


def test_an_unreachable_receiver_backs_off_then_the_row_fails(
    settings: Any, admin_client: Any
) -> None:
    settings.LOOPSWEB_NOTIFY_URL = unreachable_url()
    row = _told("host_gone", "host-b@2026-12-08T09:00:00+00:00")
    now = timezone.now()
    waits = []
    for attempt in range(1, delivery.MAX_ATTEMPTS + 1):
        outcome = delivery.notification_deliver(row.id, now=now)
        row.refresh_from_db()
        assert row.attempts == attempt
        if attempt < delivery.MAX_ATTEMPTS:
            assert outcome == delivery.RETRY
            assert row.next_attempt_at is not None
            waits.append((row.next_attempt_at - now).total_seconds())
            now = row.next_attempt_at
        else:
            assert outcome == delivery.FAILED
    assert waits == [30, 60, 120, 240, 480, 960, 1920]
    assert delivery.backoff_seconds(12) == delivery.BACKOFF_CAP
    assert row.state == NotificationState.FAILED and row.next_attempt_at is None
    assert row.last_error and row.last_error.startswith("no answer")
    # The error never carries the URL's token or query.
    assert "secret-" not in row.last_error and "127.0.0.1" not in row.last_error
    # Failed stays failed: no further try.
    assert delivery.notification_deliver(row.id, now=now) == delivery.NOT_DUE

    page = admin_client.get("/ops/").content.decode()
    section = page.split('id="notifications"')[1].split("</section>")[0]
    assert "1 notification failed to deliver" in section
    assert "<code>host_gone</code>" in section and "8 tries" in section
    assert "secret-token" not in page and "secret-query" not in page


def test_ops_escapes_what_a_failed_row_says(settings: Any, admin_client: Any) -> None:
    settings.LOOPSWEB_NOTIFY_URL = ""
    Notification.objects.create(
        kind="<b>k</b>",
        episode="e",
        text="t",
        state=NotificationState.FAILED,
        attempts=8,
        last_error="<script>alert(1)</script>",
    )
    Notification.objects.create(kind="run_failed", episode="p", text="t")
    page = admin_client.get("/ops/").content.decode()
    section = page.split('id="notifications"')[1].split("</section>")[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    assert "&lt;b&gt;k&lt;/b&gt;" in section and "<script>" not in section
    assert "1 pending" in section and "is not set" in section


def test_ops_says_nothing_of_notifications_when_off_and_empty(
    settings: Any, admin_client: Any
) -> None:
    settings.LOOPSWEB_NOTIFY_URL = ""
    assert 'id="notifications"' not in admin_client.get("/ops/").content.decode()


def test_a_redirect_is_not_followed(settings: Any) -> None:
    target = Receiver()
    moved = Receiver([302], redirect=target.url)
    try:
        settings.LOOPSWEB_NOTIFY_URL = moved.url
        row = _told()
        assert delivery.notification_deliver(row.id) == delivery.RETRY
        row.refresh_from_db()
        assert row.last_error == "HTTP 302"
        assert target.messages == [] and len(moved.messages) == 1
    finally:
        target.close()
        moved.close()


def test_the_sweep_queues_what_is_due(receiver: Receiver) -> None:
    due = _told("run_failed", "item-1:1")
    later = _told("run_failed", "item-2:1")
    sent = _told("run_failed", "item-3:1")
    fresh = _told("run_failed", "item-4:1")  # its own task goes first
    Notification.objects.exclude(pk=fresh.pk).update(
        next_attempt_at=timezone.now() - timedelta(minutes=1)
    )
    Notification.objects.filter(pk=later.pk).update(
        next_attempt_at=timezone.now() + timedelta(minutes=5)
    )
    Notification.objects.filter(pk=sent.pk).update(state=NotificationState.SENT)

    result = notifications_send()

    assert result == {"queued": 1, "poolsAvailable": 0, "clustersSilent": 0}
    (task,) = OrmQ.objects.all()
    assert task.key == "loopsweb"
    assert SignedPackage.loads(task.payload)["args"] == (due.id,)
    # The task it queued delivers it.
    assert notifications_send(due.id) == delivery.SENT
    assert receiver.texts() == ["run_failed: item-1:1"]


def test_the_sweep_does_nothing_while_the_setting_is_unset(
    settings: Any, django_assert_num_queries: Any
) -> None:
    settings.LOOPSWEB_NOTIFY_URL = ""
    with django_assert_num_queries(0):
        assert notifications_send() == {
            "queued": 0,
            "poolsAvailable": 0,
            "clustersSilent": 0,
        }
        assert notifications_send("some-id") == delivery.OFF


def test_every_kind_reaches_the_receiver_with_its_text(receiver: Receiver) -> None:
    for kind in notes.KINDS:
        row = _told(kind, f"{kind}-episode")
        assert delivery.notification_deliver(row.id) == delivery.SENT
    assert [m["body"]["kind"] for m in receiver.messages] == list(notes.KINDS)
    assert all(m["body"]["text"] for m in receiver.messages)


def _start_up(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    """Django's start-up in a process of its own with LOOPSWEB_NOTIFY_URL=`url`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "DEBUG"} and not k.startswith("LOOPSWEB_")
    }
    env.update(
        LOOPSWEB_DATA_DIR=str(tmp_path),
        SECRET_KEY="x" * 50,
        DJANGO_SETTINGS_MODULE="loopsweb.settings",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
        LOOPSWEB_NOTIFY_URL=url,
    )
    code = "import django; django.setup(); from django.conf import settings; "
    code += "print(bool(settings.LOOPSWEB_NOTIFY_URL))"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=scratch_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.own_database
@pytest.mark.parametrize(
    "url",
    [
        "ftp://hooks.example.com/T0/secret-token",
        "hooks.example.com/T0/secret-token",
        "https:///secret-token",
        "https://hooks.example.com/secret token",
    ],
)
def test_start_up_refuses_a_notify_url_that_is_not_http_without_quoting_it(
    tmp_path: Path, url: str
) -> None:
    result = _start_up(tmp_path, url)
    assert result.returncode != 0
    assert "LOOPSWEB_NOTIFY_URL must be an http:// or https:// URL" in result.stderr
    assert "secret" not in result.stderr


@pytest.mark.slow
@pytest.mark.own_database
def test_start_up_takes_an_https_notify_url(tmp_path: Path) -> None:
    result = _start_up(tmp_path, "https://hooks.slack.com/services/T0/B0/secret")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
