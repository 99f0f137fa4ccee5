"""Revisions, the record's side (docs/revisions.md): requests, the rounds, the item that needs
a human. routing.revisions starts them (admission), runs.revision_run reads them when a run
starts and ends; nothing here calls a forge or an agent.

- **A request joins the waiting one.** An item has at most one `waiting` revision: a new
  request (a verdict, a review, a comment, a failing check) appends its findings to it,
  adds its sources to `details` and moves `due_at` to the later of the two (the debounce:
  ten comments in a minute give one revision). Findings are kept to FINDINGS_KEEP
  characters, the sources to SOURCES_KEEP.
- **A round is a started revision.** `round` numbers them per item, 1 first; the budget
  counts them (`rounds_started`).
- **A run is bound to its revision once.** The newest started revision of the item that
  has no run yet is the run's (`revision_bind_run`, a conditional update): a revision the
  caps deferred is bound by whichever run admission makes for it later. A round whose run
  failed (a loop retry, a try later, a lost host, an operator's retry follow) is carried on
  by the item's next run, which is bound to it in its place.
- **A round continues the newest work.** When it starts, its base is the newest of the run
  its request named and the run that delivered the item's pull request (`revision_base`).
- **`needs_human` is where the loop gives up.** `item_needs_human` moves a finished or
  waiting item there (never a running one: its run ends first), with the reason, an event on
  its last run and one notification per item and admission.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    RevisionState,
    RunStatus,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemRevision,
    WorkItemStatus,
)
from ledger.queue import main_task
from ledger.services.common import append_event, clean_text, now_or_default
from ledger.services.notifications import notify

logger = logging.getLogger(__name__)

# The task that starts due revisions (routing.revisions; a dotted path stored in queued
# tasks and the `revisions-due` schedule).
REVISIONS_DUE_TASK = "routing.tasks.revisions_due"
# A round's run that ended so is carried on by the item's next run (`revision_bind_run`).
RETRYABLE_ENDS = (RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED)
FINDINGS_KEEP = 32_000
SOURCES_KEEP = 50
NEEDS_HUMAN_CODE = "needs_human"
NEEDS_HUMAN_EVENT = "needs_human"
JOINED = "\n\n---\n\n"


def revision_request(
    *,
    item_id: str,
    trigger: str,
    findings: str,
    source: dict[str, Any],
    base_run_id: str | None,
    due_at: datetime,
) -> WorkItemRevision | None:
    """Record a request to revise the item: join its waiting revision or make one (module
    docstring, "a request joins the waiting one"). `source` says where the findings came
    from (kept in `details["sources"]`); a source whose `key` a revision of the item holds
    already (the same review by webhook and by sync) is not counted again: None."""
    findings = clean_text(findings) or ""
    with transaction.atomic():
        # The item's row first: two requests at once (a review and its comments arrive
        # together) then join one waiting revision instead of making two.
        WorkflowWorkItem.objects.select_for_update(no_key=True).filter(
            pk=item_id
        ).first()
        if source.get("key") and source["key"] in _source_keys(item_id):
            return None
        waiting = (
            WorkItemRevision.objects.select_for_update()
            .filter(work_item_id=item_id, state=RevisionState.WAITING)
            .order_by("created_at")
            .first()
        )
        if waiting is None:
            return WorkItemRevision.objects.create(
                work_item_id=item_id,
                trigger=trigger,
                findings=findings[:FINDINGS_KEEP],
                details={"sources": [source]},
                base_run_id=base_run_id,
                due_at=due_at,
            )
        joined = JOINED.join(part for part in (waiting.findings, findings) if part)
        waiting.findings = joined[:FINDINGS_KEEP]
        sources = list((waiting.details or {}).get("sources") or [])
        waiting.details = {
            **(waiting.details or {}),
            "sources": [*sources, source][-SOURCES_KEEP:],
        }
        waiting.due_at = max(waiting.due_at, due_at)
        waiting.base_run_id = base_run_id or waiting.base_run_id
        waiting.save()
        return waiting


def _source_keys(item_id: str) -> set[str]:
    """The source keys of the item's revisions (domain.github_findings)."""
    keys: set[str] = set()
    for details in WorkItemRevision.objects.filter(work_item_id=item_id).values_list(
        "details", flat=True
    ):
        for source in (details or {}).get("sources") or []:
            if isinstance(source, dict) and isinstance(source.get("key"), str):
                keys.add(source["key"])
    return keys


def item_pull_request(item_id: str) -> tuple[str, dict[str, Any]] | None:
    """(run id, delivery record) of the item's newest run that delivered a pull request,
    or None: where a revision of the item pushes, and what the forge's head is checked
    against (`commit`)."""
    found = (
        WorkflowRun.objects.filter(
            work_item_id=item_id, delivery_json__state="delivered"
        )
        .exclude(delivery_json__pr=None)
        .order_by("-created_at")
        .values_list("id", "delivery_json")
        .first()
    )
    if found is None or not isinstance(found[1], dict) or not found[1].get("pr"):
        return None
    return found[0], found[1]


def items_of_pull_request(repo: str, number: int) -> list[str]:
    """The items whose runs delivered pull request `number` of `repo` (case aside)."""
    runs = WorkflowRun.objects.filter(
        delivery_json__pr__number=number, work_item_id__isnull=False
    ).values_list("work_item_id", "delivery_json")
    return sorted(
        {
            item_id
            for item_id, record in runs
            if isinstance(record, dict)
            and str((record.get("pr") or {}).get("repo", "")).lower() == repo.lower()
        }
    )


def rounds_started(item_id: str) -> int:
    """The item's started revisions (the budget's count)."""
    return WorkItemRevision.objects.filter(
        work_item_id=item_id, state=RevisionState.STARTED
    ).count()


def revisions_waiting(item_id: str) -> bool:
    """Whether the item has a waiting revision."""
    return WorkItemRevision.objects.filter(
        work_item_id=item_id, state=RevisionState.WAITING
    ).exists()


def revisions_due(now: datetime | None = None) -> list[str]:
    """The ids of waiting revisions due by `now`, oldest first."""
    return list(
        WorkItemRevision.objects.filter(
            state=RevisionState.WAITING, due_at__lte=now_or_default(now)
        )
        .order_by("due_at", "id")
        .values_list("id", flat=True)
    )


def revision_skip(revision_id: str, reason: str) -> bool:
    """A waiting revision skipped with `reason`; whether it was still waiting."""
    return bool(
        WorkItemRevision.objects.filter(
            pk=revision_id, state=RevisionState.WAITING
        ).update(state=RevisionState.SKIPPED, reason=clean_text(reason))
    )


def revisions_skip_waiting(item_ids: list[str], reason: str) -> int:
    """The items' waiting revisions skipped with `reason` (a pull request closed, an item
    given to a human); how many."""
    return WorkItemRevision.objects.filter(
        work_item_id__in=item_ids, state=RevisionState.WAITING
    ).update(state=RevisionState.SKIPPED, reason=clean_text(reason))


def revisions_due_queue(*, delay: float = 0.0) -> None:
    """Queue the due sweep (`REVISIONS_DUE_TASK`) on the main cluster, visible after
    `delay` seconds; never raising: the minute schedule sweeps anyway."""
    try:
        main_task(REVISIONS_DUE_TASK, task_name="revisions-due", delay=delay)
    except Exception:  # the schedule's sweep is the fallback
        logger.exception("could not queue the revisions' start")


def revision_base(revision: WorkItemRevision) -> str | None:
    """The run whose branch a round continues: the newest of the one its request named
    and the one that delivered the item's pull request (a request made while an earlier
    round ran names the run before it; the round that ran meanwhile pushed newer work)."""
    delivered = item_pull_request(revision.work_item_id)
    candidates = [r for r in (revision.base_run_id, delivered and delivered[0]) if r]
    # Ids are a millisecond timestamp first (ledger.ids): the greatest is the newest.
    return max(candidates) if candidates else None


def revision_started(
    revision: WorkItemRevision, *, round: int, run_id: str | None
) -> None:
    """The waiting `revision` is round `round`, its run `run_id` (None: the caps deferred
    it, and the run admission makes later is bound to it)."""
    WorkItemRevision.objects.filter(pk=revision.pk).update(
        state=RevisionState.STARTED,
        round=round,
        run_id=run_id,
        reason=None,
        base_run_id=revision_base(revision),
    )


def revision_bind_run(item_id: str, run_id: str) -> WorkItemRevision | None:
    """The revision run `run_id` of item `item_id` carries out, bound once (module
    docstring, "a run is bound to its revision once"); None: the run is no revision. One
    statement for a run of an item without revisions, or one already bound: a run is only
    ever bound to its item's newest round."""
    newest = (
        WorkItemRevision.objects.filter(
            work_item_id=item_id, state=RevisionState.STARTED
        )
        .order_by("-round")
        .first()
    )
    if newest is None or newest.run_id == run_id:
        return newest
    if newest.run_id is not None:
        # A run after the round's run failed (a loop retry, a try later, a host lost, an
        # operator's retry) carries the round on; one that succeeded ended it.
        ended = (
            WorkflowRun.objects.filter(pk=newest.run_id)
            .values_list("status", flat=True)
            .first()
        )
        if ended not in RETRYABLE_ENDS or run_id < newest.run_id:
            return None
    taken = WorkItemRevision.objects.filter(pk=newest.pk, run_id=newest.run_id).update(
        run_id=run_id
    )
    if not taken:
        return None
    newest.run_id = run_id
    return newest


def item_needs_human(item_id: str, reason: str, *, now: datetime | None = None) -> bool:
    """The item waits for a human (module docstring); whether it moved there now."""
    now = now_or_default(now)
    reason = clean_text(reason) or reason
    with transaction.atomic():
        item = (
            WorkflowWorkItem.objects.select_for_update()
            .filter(pk=item_id)
            .exclude(
                status__in=[*ACTIVE_WORK_ITEM_STATUSES, WorkItemStatus.NEEDS_HUMAN]
            )
            .first()
        )
        if item is None:
            return False
        WorkflowWorkItem.objects.filter(pk=item.pk).update(
            status=WorkItemStatus.NEEDS_HUMAN,
            last_reason=reason,
            reason_code=NEEDS_HUMAN_CODE,
            next_attempt_at=None,
            lease_expires_at=None,
            updated_at=now,
        )
        revisions_skip_waiting([item.pk], reason)
        if item.workflow_run_id:
            append_event(
                item.workflow_run_id, NEEDS_HUMAN_EVENT, payload={"reason": reason}
            )
        notify(
            NEEDS_HUMAN_EVENT,
            f"{item.pk}:{item.attempts}",
            f"loopsweb: work item {item.idempotency_key} needs a human: {reason}",
            {"workItemId": item.pk, "reason": reason},
        )
    return True
