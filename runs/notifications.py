"""Delivery of notifications (docs/operations.md "Notifications"): each pending row of
`loopsweb_notifications` (ledger.services.notifications) posted to LOOPSWEB_NOTIFY_URL.

Contract:
1. **The message.** One POST per try: a JSON object with `text` (what a Slack or
   Mattermost incoming webhook shows) and the structured fields `kind`, `episode`,
   `details` (the row's payload), `notificationId`, `createdAt`; `Content-Type:
   application/json`, SEND_TIMEOUT seconds, standard library only. A redirect is not
   followed (the answer is its 3xx).
2. **Sent or tried again.** A 2xx answer: `sent`, `sent_at`. Anything else (another
   status, no answer): `attempts` + 1, `last_error` the status or the reason (never the
   URL: its token, its query), the next try after a backoff (BACKOFF_FIRST seconds,
   doubling, at most BACKOFF_CAP), queued then; after MAX_ATTEMPTS tries, `failed` (shown
   on /ops/).
3. **One try at a time.** A try is claimed first (a conditional update that moves
   `next_attempt_at` past the try's end), so the task queued at the episode and the sweep
   never post one row twice at once; a try whose process died is due again after CLAIM.
4. **The sweep** (`notifications_sweep`, the `notifications-send` schedule, every minute,
   on the main cluster) tells the episodes only a periodic look finds (a pool available
   again, a silent run cluster) and queues the rows due for SWEEP_GRACE already (their own
   task was lost), so a lost task or a restart loses nothing. Deliveries run on the main
   cluster, never on a run worker.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from http.client import HTTPException
from urllib.parse import urlsplit

from django.utils import timezone

from ledger.models import Notification, NotificationState
from ledger.services.notifications import (
    notification_claim,
    notification_failed,
    notification_queue,
    notification_retry,
    notification_sent,
    notify_instances_silent,
    notify_pools_available,
    notify_url,
)

logger = logging.getLogger(__name__)

SEND_TIMEOUT = 10.0
MAX_ATTEMPTS = 8
BACKOFF_FIRST = 30.0
BACKOFF_CAP = 3600.0
# How long a claimed try keeps others off its row: past the POST's timeout.
CLAIM = timedelta(seconds=SEND_TIMEOUT + 50)
# Rows one sweep queues at most (the rest at the next), and how long past due a row must
# be: its own task (queued when it was told, or after its backoff) goes first.
SWEEP_ROWS = 50
SWEEP_GRACE = timedelta(seconds=30)
ERROR_CHARS = 300

SENT, RETRY, FAILED, OFF, NOT_DUE = "sent", "retry", "failed", "off", "not due"


def backoff_seconds(attempts: int) -> float:
    """The wait after the `attempts`-th failed try."""
    return min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** max(0, attempts - 1))


def message(row: Notification) -> dict[str, object]:
    return {
        "text": row.text,
        "kind": row.kind,
        "episode": row.episode,
        "details": row.payload or {},
        "notificationId": row.id,
        "createdAt": row.created_at.isoformat() if row.created_at else None,
    }


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # the 3xx is the answer (module docstring, "the message")


_opener = urllib.request.build_opener(_NoRedirect)


def _scrub(text: str, url: str) -> str:
    """`text` without the URL, its query or its credentials (an error may quote them)."""
    parts = urlsplit(url)
    for secret in (url, parts.query, parts.password or "", parts.username or ""):
        if secret and len(secret) >= 3:
            text = text.replace(secret, "…")
    return text[:ERROR_CHARS]


def post_json(url: str, body: dict[str, object]) -> str | None:
    """POST `body` as JSON; None on a 2xx answer, else what went wrong (module docstring)."""
    data = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "loopsweb"},
    )
    try:
        with _opener.open(request, timeout=SEND_TIMEOUT) as answer:
            status = int(answer.status)
            answer.read(4096)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return _scrub(f"no answer: {exc.reason}", url)
    except TimeoutError:
        return "no answer: timed out"
    except (OSError, HTTPException, ValueError) as exc:
        return _scrub(f"no answer: {type(exc).__name__}: {exc}", url)
    return None if 200 <= status < 300 else f"HTTP {status}"


def notification_deliver(notification_id: str, *, now: datetime | None = None) -> str:
    """One try of the row (module docstring, "the message" to "one try at a time"):
    SENT, RETRY (its next try queued), FAILED, or OFF / NOT_DUE (nothing done: no URL;
    not pending, not due, or claimed)."""
    url = notify_url()
    if not url:
        return OFF
    given = now
    now = now or timezone.now()
    row = notification_claim(notification_id, now=now, hold=CLAIM)
    if row is None:
        return NOT_DUE
    error = post_json(url, message(row))
    ended = given or timezone.now()  # after the POST
    if error is None:
        notification_sent(notification_id, at=ended)
        return SENT
    attempts = row.attempts + 1
    if attempts >= MAX_ATTEMPTS:
        notification_failed(notification_id, attempts=attempts, error=error)
        logger.warning(
            "notification %s (%s) failed to deliver after %d tries: %s",
            row.id,
            row.kind,
            attempts,
            error,
        )
        return FAILED
    delay = backoff_seconds(attempts)
    notification_retry(
        notification_id,
        attempts=attempts,
        error=error,
        due=ended + timedelta(seconds=delay),
    )
    notification_queue(row.id, delay=delay + 1.0)
    return RETRY


def notifications_sweep(now: datetime | None = None) -> dict[str, int]:
    """The `notifications-send` schedule (module docstring, "the sweep")."""
    if not notify_url():
        return {"queued": 0, "poolsAvailable": 0, "clustersSilent": 0}
    now = now or timezone.now()
    available = notify_pools_available(now)
    silent = notify_instances_silent(now)
    due = list(
        Notification.objects.filter(
            state=NotificationState.PENDING, next_attempt_at__lte=now - SWEEP_GRACE
        )
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:SWEEP_ROWS]
    )
    for notification_id in due:
        notification_queue(notification_id)
    return {
        "queued": len(due),
        "poolsAvailable": len(available),
        "clustersSilent": len(silent),
    }
