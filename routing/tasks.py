"""django-q2 tasks of routing: thin adapters over the drain service. Their dotted paths
(`routing.tasks.drain`) are stored in schedules and queued tasks: they never move."""

from __future__ import annotations

from typing import Any

from routing.drains import drain_options, drain_run


def drain(
    kind: str, options: dict[str, Any] | None = None, name: str | None = None, **_q: Any
) -> dict[str, Any]:
    """Run one drain. `name` is the schedule's name: the drain's default --max-active scope.

    Delivered twice (broker redelivery, two clusters), it admits nothing twice: every
    admission dedupes on the work item's (route, idempotency key) under the admission lock,
    and a delivery that overlaps a running drain of its scope steps aside.
    """
    report = drain_run(options=drain_options(kind, options or {}, name=name))
    return {
        "drainId": report.record_id,
        **{k: v for k, v in report.counts.items()},
        "error": report.error,
        "recordError": report.record_error,
        "heldReason": report.held_reason,
        "overlapSkipped": report.overlapped,
    }
