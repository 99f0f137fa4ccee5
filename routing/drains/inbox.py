"""The event inbox: delivered envelopes, stored idempotently on (source, id).

`inbox_ingest` is the one write path (the `ingest_events` command and the HTTP API):
1. Every envelope is validated first (shape, storable values, column lengths); an invalid
   one is reported with its position.
2. With `all_or_nothing` (the default), any invalid envelope means nothing is stored.
3. Valid envelopes are inserted unless (source, id) already exists: a duplicate delivery,
   within the batch or across batches, changes nothing and is reported as duplicate.
4. The whole batch is one transaction; on PostgreSQL an advisory lock serialises ingests so
   "new" and "duplicate" are exact even when two producers deliver the same event at once.
5. Once it commits, new events wake the drain schedules that take them (routing.drains.wake),
   unless the caller routes them itself (`wake=False`: the API's `route=now`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError as ModelValidationError
from django.db import connection, transaction
from django.utils import timezone

from domain.errors import ApplicationError
from domain.events import (
    Envelope,
    parse_envelope,
    string_field,
)
from ledger.lock import ADVISORY_NAMESPACE, admission_lock
from ledger.models import WorkflowWorkItem
from routing.admission import item_inbox_reopen
from routing.drains.sources import TODOS_EVENT_PREFIX, candidate_project
from routing.drains.wake import drains_wake_after_ingest
from routing.models import InboxEvent, InboxState

INGEST_LOCK_KEY = 2
CHUNK = 1000


@dataclass
class IngestReport:
    new: list[dict[str, str]] = field(default_factory=list)
    duplicate: list[dict[str, str]] = field(default_factory=list)
    invalid: list[dict[str, Any]] = field(default_factory=list)
    stored: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "new": len(self.new),
            "duplicate": len(self.duplicate),
            "invalid": len(self.invalid),
            "stored": self.stored,
            "newEvents": self.new,
            "duplicateEvents": self.duplicate,
            "invalidEvents": self.invalid,
        }


class IngestRejected(ApplicationError):
    def __init__(self, report: IngestReport) -> None:
        first = report.invalid[0]
        super().__init__(
            f"{len(report.invalid)} invalid envelope(s); first at {first['at']}: {first['error']}"
        )
        self.report = report


def project_hint(envelope: Envelope) -> str | None:
    """The project an envelope names, un-normalised, as the drain that takes it reads it
    (`candidate_project`): its path prefix filter and the round-robin key of fair drains."""
    task = envelope.type.startswith(TODOS_EVENT_PREFIX)
    return string_field(candidate_project(envelope, task=task))


def _row(envelope: Envelope) -> InboxEvent:
    return InboxEvent(
        source=envelope.source,
        event_id=envelope.id,
        event_type=envelope.type,
        subject=envelope.subject,
        event_time=envelope.time,
        data=envelope.data,
        metadata=envelope.metadata,
        project_hint=project_hint(envelope),
    )


# Envelope names for inbox columns, so a too-long value is reported as the producer sent it.
_COLUMN_NAMES = {
    "source": "event.source",
    "event_id": "event.id",
    "event_type": "event.type",
    "subject": "event.subject",
    "event_time": "event.time",
    "project_hint": "project path",
}


_UNCHECKED_FIELDS = [
    f.name for f in InboxEvent._meta.concrete_fields if f.name not in _COLUMN_NAMES
]


def _checked_row(envelope: Envelope) -> InboxEvent:
    """The inbox row for an envelope, refused when a value overflows its column.

    SQLite ignores varchar lengths and PostgreSQL raises mid-batch; checking each row first
    keeps a rejected batch free of writes on both. `clean_fields` runs no queries.
    """
    row = _row(envelope)
    try:
        # Only the envelope's text columns: an empty `data` {} is valid though "blank".
        row.clean_fields(exclude=_UNCHECKED_FIELDS)
    except ModelValidationError as exc:
        column, messages = next(iter(exc.message_dict.items()))
        raise ApplicationError(
            f"{_COLUMN_NAMES.get(column, column)}: {messages[0]}"
        ) from None
    return row


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def inbox_ingest(
    items: Iterable[tuple[Any, object]],
    *,
    all_or_nothing: bool = True,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    wake: bool = True,
) -> IngestReport:
    """Store (position, envelope-object) pairs. Raises IngestRejected in all-or-nothing mode
    when any envelope is invalid (nothing stored); dry runs validate and classify only."""
    report = IngestReport()
    seen = 0
    new_types: set[str] = set()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, %s)",
                    [ADVISORY_NAMESPACE, INGEST_LOCK_KEY],
                )
        batch_keys: set[tuple[str, str]] = set()
        for chunk in _chunks(items, CHUNK):
            valid: list[tuple[Envelope, InboxEvent]] = []
            for position, obj in chunk:
                try:
                    if isinstance(
                        obj, ApplicationError
                    ):  # the reader already found it invalid
                        raise obj
                    envelope = parse_envelope(obj)
                    valid.append((envelope, _checked_row(envelope)))
                except ApplicationError as exc:
                    report.invalid.append({"at": position, "error": str(exc)})
            existing = _existing_keys([envelope for envelope, _ in valid])
            rows = []
            for envelope, row in valid:
                key = (envelope.source, envelope.id)
                ref = {"source": envelope.source, "id": envelope.id}
                if key in existing or key in batch_keys:
                    report.duplicate.append(ref)
                    continue
                batch_keys.add(key)
                report.new.append(ref)
                rows.append(row)
                new_types.add(envelope.type)
            if rows and not dry_run and not (all_or_nothing and report.invalid):
                InboxEvent.objects.bulk_create(rows)
            seen += len(chunk)
            if progress:
                progress(seen)
        if all_or_nothing and report.invalid:
            report.stored = False
            transaction.set_rollback(True)
            raise IngestRejected(report)
        if dry_run:
            report.stored = False
            transaction.set_rollback(True)
        elif wake and new_types:
            transaction.on_commit(lambda: drains_wake_after_ingest(new_types))
    return report


def _existing_keys(envelopes: list[Envelope]) -> set[tuple[str, str]]:
    by_source: dict[str, list[str]] = {}
    for envelope in envelopes:
        by_source.setdefault(envelope.source, []).append(envelope.id)
    found: set[tuple[str, str]] = set()
    for source, ids in by_source.items():
        found.update(
            InboxEvent.objects.filter(source=source, event_id__in=ids).values_list(
                "source", "event_id"
            )
        )
    return found


def inbox_reopen_requeued(
    sender: type[WorkflowWorkItem],
    *,
    item: WorkflowWorkItem,
    now: datetime,
    **kwargs: Any,
) -> None:
    """Receiver of `ledger.signals.work_item_requeued`: the events that produced a requeued
    item go back to `pending` (inside the requeue's transaction), so the next drain routes
    it again (routing.admission.item_inbox_reopen)."""
    item_inbox_reopen(item, now)


# --- operator actions on inbox rows -----------------------------------------------------------

INBOX_EVENT_NOT_FOUND = "inbox event not found: {event_id}"
INBOX_NOT_REOPENABLE = "inbox event is not reopenable: {event_id} state={state}"
INBOX_NOT_DISCARDABLE = "inbox event is not discardable: {event_id} state={state}"
INBOX_REASON_REQUIRED = "a reason is required"
# Retry: rows a drain gave up on (failed, skipped) or holds (deferred) go back to pending.
REOPENABLE_INBOX_STATES = (InboxState.FAILED, InboxState.SKIPPED, InboxState.DEFERRED)
# Discard: rows a drain would still route (or that failed) are settled as skipped.
DISCARDABLE_INBOX_STATES = (InboxState.PENDING, InboxState.DEFERRED, InboxState.FAILED)


def _inbox_operator_update(
    *,
    inbox_id: str,
    allowed: tuple[str, ...],
    refused: str,
    state: str,
    reason: str,
    actor: str,
    now: datetime,
) -> InboxEvent:
    if not reason or not reason.strip():
        raise ApplicationError(INBOX_REASON_REQUIRED)
    with transaction.atomic():
        # Every writer of inbox rows a drain may claim takes the admission lock first (see
        # drains.run): a drain's claim and this update cannot interleave.
        admission_lock()
        row = InboxEvent.objects.filter(pk=inbox_id).defer("data", "metadata").first()
        if row is None:
            raise ApplicationError(INBOX_EVENT_NOT_FOUND.format(event_id=inbox_id))
        if row.state not in allowed:
            raise ApplicationError(
                refused.format(event_id=f"{row.source}:{row.event_id}", state=row.state)
            )
        text = f"{reason.strip()} (by {actor})"
        # Conditional on the state read above: a drain that settled the row meanwhile wins.
        changed = InboxEvent.objects.filter(pk=row.pk, state=row.state).update(
            state=state, reason_code=None, last_reason=text, updated_at=now
        )
        if not changed:  # pragma: no cover - the lock makes this unreachable
            raise ApplicationError(refused.format(event_id=row.event_id, state="?"))
        row.state, row.last_reason, row.reason_code = state, text, None
    return row


def inbox_reopen(
    *, inbox_id: str, reason: str, actor: str, now: datetime | None = None
) -> InboxEvent:
    """Operator retry: a failed, skipped or deferred inbox row goes back to `pending`, so the
    next drain routes it again (route_attempts kept). `last_reason` names the user."""
    return _inbox_operator_update(
        inbox_id=inbox_id,
        allowed=REOPENABLE_INBOX_STATES,
        refused=INBOX_NOT_REOPENABLE,
        state=InboxState.PENDING,
        reason=reason,
        actor=actor,
        now=now or timezone.now(),
    )


def inbox_discard(
    *, inbox_id: str, reason: str, actor: str, now: datetime | None = None
) -> InboxEvent:
    """Operator discard: a pending, deferred or failed row becomes `skipped` (no drain scans
    it again); `last_reason` keeps the reason and the user."""
    return _inbox_operator_update(
        inbox_id=inbox_id,
        allowed=DISCARDABLE_INBOX_STATES,
        refused=INBOX_NOT_DISCARDABLE,
        state=InboxState.SKIPPED,
        reason=reason,
        actor=actor,
        now=now or timezone.now(),
    )
