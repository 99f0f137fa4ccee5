"""Retention of drain records: the ones that did nothing are kept a configurable number of
days (LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS), then pruned by a periodic task.

An idle scheduled drain writes one record a minute that considered no candidate: a wall of
identical rows on the drains page and a table that only grows. A record is *empty* when it
considered nothing and has no error; every record that routed, held, skipped or failed an
item, or failed itself, is kept.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet

from routing.models import DrainRecord

PRUNE_BATCH = 5000

# The drains page filters (and what "empty" is the complement of).
DID_SOMETHING = Q(considered__gt=0)
HAS_ERROR = Q(error__isnull=False) | Q(fatal__gt=0)
HELD = Q(held_reason__isnull=False)
EMPTY = Q(considered=0, fatal=0, error__isnull=True)


def empty_drain_records(*, before: datetime) -> QuerySet[DrainRecord]:
    """Empty records that started before `before` (a range of idx_drains_started)."""
    return DrainRecord.objects.filter(EMPTY, started_at__lt=before)


def drain_records_prune(*, now: datetime, days: int, dry_run: bool = False) -> int:
    """Delete empty drain records older than `days` days, in batches of PRUNE_BATCH ids (each
    its own short transaction, so drains writing records are never held up). Returns how
    many were (or, with dry_run, would be) deleted."""
    before = now - timedelta(days=days)
    if dry_run:
        return empty_drain_records(before=before).count()
    deleted = 0
    while True:
        ids = list(
            empty_drain_records(before=before)
            .order_by("started_at")
            .values_list("id", flat=True)[:PRUNE_BATCH]
        )
        if not ids:
            return deleted
        with transaction.atomic():
            deleted += DrainRecord.objects.filter(pk__in=ids).delete()[0]
