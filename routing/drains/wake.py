"""Arriving events wake the drains that would take them, so a task starts in seconds, not
at the schedule's next firing (django-q2 fires schedules on the minute and looks every 30 s).

When an ingest stores new events (`inbox_ingest`: the API without `route=now`, or
`ingest_events`), each drain schedule that reads the inbox (not a `--source-command` one),
whose kind takes one of them (a `task.*` event: todos-task; any other: generic) and that is
not paused is woken once it commits:
its drain is queued on the main cluster now (`routing.tasks.drain_woken`, the schedule's
own options read when it runs). At most one woken drain per schedule per
LOOPSWEB_INGEST_WAKE_SECONDS (0: no wake-ups, the schedules alone), and none is lost:

- a schedule's row (`DrainWake`) holds when its last woken drain is due; an event that
  commits before then is seen by that drain, whose scan starts after it is due, so nothing
  more is queued;
- an event that commits after it queues the next drain, due at the later of now and the
  last one's due time plus the spacing. The row is locked while this is decided and the
  task is queued in the same transaction, so two ingests at once queue one drain;
- a woken drain that finds its scope's drain running steps aside as any drain does, and
  wakes its schedule again a spacing later: the running one may have scanned before the
  events that woke it.

A lost wake-up (a process stopped between its commit and the queueing) costs only time:
the schedule fires as before, and its period stays the upper bound.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from ledger.queue import main_task
from routing.drains.configs import ScheduledDrain, scheduled_drains
from routing.drains.routable import kind_for_event_type
from routing.drains.sources import INBOX_SOURCE
from routing.models import DrainWake

logger = logging.getLogger(__name__)

# The django-q2 function a wake-up queues (routing.tasks); stored in queued tasks.
WOKEN_FUNC = "routing.tasks.drain_woken"


def wake_spacing() -> timedelta | None:
    """The least time between two woken drains of one schedule; None: wake-ups are off."""
    seconds = settings.LOOPSWEB_INGEST_WAKE_SECONDS
    return timedelta(seconds=seconds) if seconds > 0 else None


def drains_wake(event_types: Iterable[str], now: datetime | None = None) -> list[str]:
    """Wake the schedules whose drains take events of these types (module docstring).
    Returns the names of those a drain was queued for."""
    spacing = wake_spacing()
    kinds = {kind_for_event_type(event_type) for event_type in event_types}
    if spacing is None or not kinds:
        return []
    now = now or timezone.now()
    woken = []
    pending = set(  # a queued drain not due yet sees these events: no lock, no write
        DrainWake.objects.filter(due_at__gte=now).values_list("schedule", flat=True)
    )
    for schedule in scheduled_drains():
        if (
            schedule.paused
            or schedule.kind not in kinds
            # a --source-command drain never reads the inbox
            or schedule.options.get("source", INBOX_SOURCE) != INBOX_SOURCE
            or schedule.name in pending
        ):
            continue
        with transaction.atomic():  # the row and the task commit together
            due = _wake_due(schedule.name, now, spacing)
            if due is not None:
                _queue(schedule, delay=(due - now).total_seconds())
                woken.append(schedule.name)
    return woken


def drains_wake_after_ingest(event_types: Iterable[str]) -> None:
    """`drains_wake` once an ingest committed: its events are stored whatever happens here,
    so a database error is one warning line (the schedules take them at their next firing),
    never an error for the ingest's caller."""
    try:
        drains_wake(event_types)
    except DatabaseError as exc:
        logger.warning(
            "arriving events did not wake the drains (%s): the schedules take them at "
            "their next firing",
            exc,
        )


def drain_wake_again(name: str, now: datetime | None = None) -> bool:
    """A woken drain stepped aside for its scope's running drain: wake its schedule again
    a spacing from now (False: wake-ups are off, or it is gone or paused)."""
    spacing = wake_spacing()
    schedule = woken_schedule(name)
    if spacing is None or schedule is None:
        return False
    now = now or timezone.now()
    with transaction.atomic():
        DrainWake.objects.update_or_create(
            schedule=name, defaults={"due_at": now + spacing}
        )
        _queue(schedule, delay=spacing.total_seconds())
    return True


def _wake_due(name: str, now: datetime, spacing: timedelta) -> datetime | None:
    """When the drain this wake-up queues is due, or None when the last one queued is not
    due yet (it will see what committed before now). The row is locked (PostgreSQL; on
    SQLite every transaction takes the write lock), so two ingests at once queue one."""
    row = DrainWake.objects.select_for_update().filter(schedule=name).first()
    if row is None:
        try:
            with transaction.atomic():
                DrainWake.objects.create(schedule=name, due_at=now)
        except IntegrityError:  # another ingest made it at the same moment: it queued
            return None
        return now
    if row.due_at >= now:
        return None
    row.due_at = max(now, row.due_at + spacing)
    row.save(update_fields=["due_at"])
    return row.due_at


def _queue(schedule: ScheduledDrain, *, delay: float) -> None:
    """The schedule's drain as a task on the main cluster, visible after `delay` s."""
    main_task(
        WOKEN_FUNC,
        schedule.name,
        task_name=f"wake-{schedule.name}",
        group=schedule.name,
        delay=delay,
    )


def drain_wakes_forget(names: Iterable[str]) -> None:
    """The wake-up rows of schedules that are gone (`schedule_drain --delete`)."""
    DrainWake.objects.filter(schedule__in=list(names)).delete()


def woken_schedule(name: str) -> ScheduledDrain | None:
    """The drain schedule `name` as it is now, unless it is gone or paused (a woken drain
    then does nothing)."""
    found = next((s for s in scheduled_drains() if s.name == name), None)
    return None if found is None or found.paused else found
