"""What a drain writes on an inbox row: the claim (with the outcome of a route or a hold:
state, reason, code, in the same statement), a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db.models import F

from routing.admission import (
    CREATED,
    DEDUPED,
    SKIPPED,
    THROTTLED,
    RouteResult,
)
from routing.drains.sources import (
    Candidate,
)
from routing.models import OPEN_INBOX_STATES, InboxEvent, InboxState


def inbox_claim(candidate: Candidate, **record: Any) -> bool:
    """Take an inbox row for this drain: a conditional update, so it works on both databases.

    Concurrent drains scan the same oldest rows; without a claim they would all route the
    same events and spend their time on dedupes. Losing the claim means another drain took
    the row since the scan: this one skips it. `record` (state, reason, ...) settles the row
    in the same statement, for an item that is held or skipped without an admission.
    """
    return bool(
        InboxEvent.objects.filter(
            pk=candidate.inbox_id,
            state__in=OPEN_INBOX_STATES,
            route_attempts=candidate.route_attempts,
        ).update(route_attempts=F("route_attempts") + 1, **record)
    )


def hold_record(result: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The inbox columns for an item held by a pre-check, skipped, or failed."""
    state = InboxState.DEFERRED
    if result.get("fatal"):
        state = InboxState.FAILED
    elif result["kind"] == SKIPPED:
        state = InboxState.SKIPPED
    return {
        "state": state,
        "last_reason": result.get("reason"),
        "reason_code": result.get("reasonCode"),
        "routed_at": now,
        "updated_at": now,
    }


INBOX_STATE = {
    CREATED: InboxState.ADMITTED,
    DEDUPED: InboxState.ADMITTED,
    THROTTLED: InboxState.DEFERRED,
    SKIPPED: InboxState.SKIPPED,
}


def route_record(result: RouteResult, now: datetime) -> dict[str, Any]:
    """The inbox columns for a routed item (created, deduped, throttled, skipped)."""
    return {
        "state": INBOX_STATE[result.kind],
        "work_item": result.work_item,
        "last_reason": result.reason
        or (result.work_item.last_reason if result.work_item else None),
        "reason_code": result.reason_code,
        "routed_at": now,
        "updated_at": now,
    }


def inbox_record_route(inbox_id: str, result: RouteResult, now: datetime) -> None:
    InboxEvent.objects.filter(pk=inbox_id).update(**route_record(result, now))


def record_failure(
    candidate: Candidate, result: Mapping[str, Any], now: datetime
) -> None:
    """Mark the row failed, unless another drain took it since the scan (a failed attempt's
    own claim rolled back with it)."""
    if candidate.inbox_id:
        inbox_claim(candidate, **hold_record(result, now))


def inbox_record_hold(
    inbox_id: str | None, result: Mapping[str, Any], now: datetime
) -> None:
    """Record a failed or held item on its inbox row (no admission happened)."""
    if inbox_id:
        InboxEvent.objects.filter(pk=inbox_id).update(**hold_record(result, now))
