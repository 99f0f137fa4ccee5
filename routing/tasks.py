"""django-q2 tasks of routing: thin adapters over the drain service. Their dotted paths
(`routing.tasks.drain`) are stored in schedules and queued tasks: they never move."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone

from routing.drains import drain_options, drain_run
from routing.drains.retention import drain_records_prune
from routing.drains.wake import drain_wake_again, woken_schedule
from routing.github_sync import github_sync as run_github_sync
from routing.revisions import revisions_start_due


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


def drain_woken(name: str, **_q: Any) -> dict[str, Any] | None:
    """The drain of schedule `name`, queued by arriving events (routing.drains.wake), with
    the schedule's options as they are now; nothing when it is gone or paused. One that
    steps aside for its scope's running drain wakes the schedule again."""
    schedule = woken_schedule(name)
    if schedule is None or schedule.kind is None:
        return None
    result = drain(schedule.kind, schedule.options, name=name)
    if result["overlapSkipped"]:
        drain_wake_again(name)
    return result


def prune_empty_drains(**_q: Any) -> dict[str, Any]:
    """Delete drain records that did nothing, older than LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS
    (the `prune-empty-drains` schedule). Delivered twice, the second finds nothing."""
    days = settings.LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS
    deleted = drain_records_prune(now=timezone.now(), days=days)
    return {"deleted": deleted, "retentionDays": days}


def revisions_due(**_q: Any) -> dict[str, Any]:
    """Start the revisions that are due (routing.revisions): queued when a request is
    recorded or a run of its item ends, and swept every minute (the `revisions-due`
    schedule). Delivered twice, the second finds them started."""
    outcomes = revisions_start_due()
    return {"revisions": outcomes}


def github_sync(**_q: Any) -> dict[str, Any] | None:
    """One pass of the webhook's polling fallback (routing.github_sync; the `github-sync`
    schedule): nothing when no GitHub token is configured."""
    if not settings.LOOPSWEB_GITHUB_TOKEN_FILE:
        return None
    return run_github_sync().as_dict()
