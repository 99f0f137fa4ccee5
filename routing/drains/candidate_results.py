"""What a drain reports for a candidate it did not admit, and the rows it held unread.

- `DrainFull`: the caps a drain has seen full (`FullCaps`) and the rows it held unread because
  everything was full, written with one UPDATE at the end of the drain;
- `held_result`, `candidate_held`, `hold_unread`: a pre-check hold's result (with a plan, or
  unread when everything is full);
- `failed_result`: a candidate whose routing raised (a route error is skipped, anything else
  fatal), its row recording the failure;
- `envelope_task`: the todos task an envelope carries, for results made without a plan.

The drain loop that uses them is routing.drains.run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from domain.events import record_tags, task_field, todos_project_path_hint
from ledger.dberrors import error_passes
from routing.admission import (
    SKIPPED,
    THROTTLED,
    FullCaps,
    Hold,
    RoutePlan,
    RouteRefused,
)
from routing.drains.outage import stop_if_connection_lost
from routing.drains.outcomes import hold_record, record_failure
from routing.drains.report import DrainReport
from routing.drains.sources import Candidate
from routing.models import OPEN_INBOX_STATES, InboxEvent, InboxState
from runs.projects import WorktreeRequired


@dataclass
class DrainFull(FullCaps):
    """The caps this drain has seen full (`FullCaps`), and the rows it held unread because
    everything was full: written with one UPDATE at the end of the drain."""

    held_rows: list[str] = field(default_factory=list)

    def record_held_rows(self, now: datetime) -> None:
        """One UPDATE for the rows held because everything was full (still open ones only:
        a row another drain routed meanwhile keeps its outcome). It locks the rows in id
        order, as a batch does (routing.drains.inbox_batch), so concurrent drains never deadlock
        on PostgreSQL."""
        if self.held_rows and self.every is not None:
            hold = self.every
            rows = InboxEvent.objects.filter(
                pk__in=self.held_rows, state__in=OPEN_INBOX_STATES
            )
            with transaction.atomic():  # FOR UPDATE needs a transaction
                InboxEvent.objects.filter(
                    pk__in=rows.order_by("pk").select_for_update().values("pk")
                ).update(
                    **hold_record(
                        {
                            "kind": THROTTLED,
                            "reason": hold.reason,
                            "reasonCode": hold.code,
                        },
                        now,
                    )
                )


def envelope_task(envelope: Any) -> dict[str, Any] | None:
    """The todos task an envelope carries, as results report it (no plan was made: held
    unread or failed); None for an envelope without a task id."""
    if not envelope.type.startswith("task."):
        return None
    data = envelope.data
    task_id = task_field(data, "id", "task_id", "taskId")
    if task_id is None:
        return None
    return {
        "id": task_id,
        "title": task_field(data, "title"),
        "description": task_field(data, "description"),
        "tags": record_tags(data),
        "projectPath": todos_project_path_hint(data, envelope.metadata, option=None),
    }


def held_result(
    envelope: Any, hold: Hold, plan: RoutePlan | None = None
) -> dict[str, Any]:
    """A pre-check hold; without `plan` (held unread, everything full) no key is known."""
    result: dict[str, Any] = {
        "kind": THROTTLED,
        "skipped": True,
        "queuedAtSource": True,
        "precheck": True,
        "reason": hold.reason,
        "reasonCode": hold.code,
        "event": {"id": envelope.id, "type": envelope.type, "source": envelope.source},
    }
    if plan is not None:
        result.update(idempotencyKey=plan.idempotency_key, taskId=plan.task_id)
        if plan.task is not None:
            result["task"] = plan.task
        result["workflow"] = {
            "name": plan.workflow_name,
            "stored": False,
            **plan.spec,
        }
    else:
        task = envelope_task(envelope)
        if task is not None:
            result.update(taskId=task["id"], task=task)
    return result


def candidate_held(candidate: Candidate, hold: Hold, plan: RoutePlan) -> dict[str, Any]:
    return held_result(candidate.envelope, hold, plan)


def failed_result(
    candidate: Candidate, exc: Exception, now: datetime, dry_run: bool
) -> dict[str, Any]:
    """The result of a candidate whose routing raised; its row records the failure.

    A lost database connection is not this candidate's failure: it stops the drain
    (ConnectionLost, see routing.drains.outage) and the row stays as it was."""
    stop_if_connection_lost(exc)
    envelope = candidate.envelope
    assert envelope is not None
    if isinstance(exc, RouteRefused | WorktreeRequired):
        # A route error, not a task error (docs/upstream.md §5): skipped, the drain goes on.
        result: dict[str, Any] = {
            "kind": SKIPPED,
            "skipped": True,
            "routeError": True,
            "reason": str(exc)[:640],
            "event": {"id": envelope.id, "type": envelope.type},
        }
        task = envelope_task(envelope)
        if task is not None:
            result.update(taskId=task["id"], task=task)
        if not dry_run:
            record_failure(candidate, result, now)
        return result
    result = {
        "kind": SKIPPED,
        "skipped": True,
        "fatal": True,
        "reason": f"{type(exc).__name__}: {exc}"[:640],
        "event": {"id": envelope.id, "type": envelope.type},
    }
    task = envelope_task(envelope)
    if task is not None:
        result.update(taskId=task["id"], task=task)
    if error_passes(exc):
        # Passing (a deadlock, a locked database, a lock timeout): the row stays open for
        # a later drain; the drain still reports it as fatal. Any other error would come
        # back every time (a value no index holds): the row is marked failed with it.
        result["reason"] += " (left open for a later drain)"
    elif not dry_run:
        record_failure(candidate, result, now)
    return result


def hold_unread(
    candidate: Candidate, full: DrainFull, report: DrainReport
) -> dict[str, Any]:
    """Hold a candidate once the scope (or the shared pool) is full: no read, and its row is
    written with the others at the end (unless it already records this very hold)."""
    hold = full.every
    assert hold is not None and candidate.envelope is not None
    report.held_reason = hold.reason
    if (
        candidate.inbox_id
        and not report.dry_run
        and not candidate.recorded_as(InboxState.DEFERRED, hold.code, hold.reason)
    ):
        full.held_rows.append(candidate.inbox_id)
    return held_result(candidate.envelope, hold)
