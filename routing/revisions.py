"""Revisions started (docs/revisions.md): a waiting revision becomes a new run of its item on
the item's stored route, or is skipped with why, or the item goes to a human.

`revision_start` decides, in this order:

1. **Not yet.** Not due (a later finding moved its `due_at`), or the item has a run that is
   not over (at most one round of an item runs at a time; the run's end queues it again):
   it keeps waiting.
2. **Over.** The item was cancelled or already waits for a human: skipped, with why.
3. **The budget.** The item's started rounds reach its `--max-revisions`: skipped, and the
   item goes to `needs_human`: one comment and the label `needs-human` on its pull request
   when it has one, one notification.
4. **The pull request moved on.** A revision that continues a delivered pull request reads
   it first (`GET .../pulls/{n}`): merged or closed, or its head is not the commit loopsweb
   pushed (a human pushed): skipped with the reason.
5. **Started.** One transaction under the admission lock: the item is re-admitted with its
   stored route (`routing.admission.retry.retry_work_item`: caps, pool and windows decide;
   a capped round waits as a deferral), and the revision is round N, bound to the run made
   for it now or, when deferred, to the run a drain makes later
   (`ledger.services.revisions.revision_bind_run`).

The forge is asked before the transaction, never inside it. A forge that cannot be reached
leaves the revision waiting; the next due sweep (`routing.tasks.revisions_due`, every minute)
tries again.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from domain.errors import ApplicationError
from domain.github_findings import Finding
from domain.revisions import max_revisions
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    RevisionState,
    RevisionTrigger,
    WorkflowWorkItem,
    WorkItemRevision,
    WorkItemStatus,
)
from ledger.services.common import LedgerError
from ledger.services.revisions import (
    item_pull_request,
    items_of_pull_request,
    revision_request,
    revision_skip,
    revision_started,
    revisions_due,
    revisions_due_queue,
    rounds_started,
)
from routing.admission import retry_work_item
from runs.github import ForgeError, get_pull_request
from runs.revision_run import needs_human

logger = logging.getLogger(__name__)


WAITS_FOR_RUN = "waits: the item's run {run_id} is not over"
SKIP_ITEM_OVER = "skipped: the item is {status}"
SKIP_OFF = "skipped: revisions are off for this item (--max-revisions 0)"
BUDGET_SPENT = (
    "the revision budget is spent ({rounds} of {budget} rounds): a {trigger} sent the "
    "work back again"
)
OFF_VERDICT = (
    "the verifier asked for changes and revisions are off for this item "
    "(--max-revisions 0)"
)
PR_CLOSED = "skipped: the pull request #{number} is {state}"
PR_HEAD_MOVED = (
    "skipped: the pull request #{number}'s head is {head}, not {pushed} that loopsweb "
    "pushed (someone else pushed to it)"
)
FORGE_UNREACHED = "waits: the pull request could not be read: {error}"
STARTED = "round {round} of {budget}: {outcome}"
STALE_CHECK = (
    "ignored for {item_id}: the check ran on {commit}, not {pushed} that loopsweb pushed "
    "last"
)
REVISION_REASON = "revision {round} of {budget} ({trigger})"


def revision_request_queue(
    *,
    item_id: str,
    trigger: str,
    findings: str,
    source: dict[str, Any],
    base_run_id: str | None,
    delay: float,
) -> WorkItemRevision | None:
    """Record the request (`ledger.services.revisions.revision_request`: it joins the
    item's waiting revision; None when its source was counted already) and queue its start
    for when it is due, once this commits."""
    due = timezone.now() + timedelta(seconds=delay)
    revision = revision_request(
        item_id=item_id,
        trigger=trigger,
        findings=findings,
        source=source,
        base_run_id=base_run_id,
        due_at=due,
    )
    if revision is not None:
        transaction.on_commit(lambda: revisions_due_queue(delay=delay + 0.05))
    return revision


def pull_request_revision(
    repo: str,
    numbers: list[int],
    found: Finding,
    *,
    commit: str | None,
    delay: float,
) -> list[str]:
    """A revision request of `found` for each item whose pull request is one of `numbers`
    in `repo` (only pull requests loopsweb opened); a check's `commit` must be the one
    loopsweb pushed last (a check of an older commit is stale); one outcome each."""
    outcomes = []
    for number in numbers:
        for item_id in items_of_pull_request(repo, number):
            delivered = item_pull_request(item_id)
            pushed = delivered[1].get("commit") if delivered else None
            if commit and pushed and commit != pushed:
                outcomes.append(
                    STALE_CHECK.format(
                        item_id=item_id, commit=commit[:12], pushed=str(pushed)[:12]
                    )
                )
                continue
            revision = revision_request_queue(
                item_id=item_id,
                trigger=found.trigger,
                findings=found.text,
                source={**found.source, "repo": repo, "pr": number},
                base_run_id=delivered[0] if delivered else None,
                delay=delay,
            )
            outcomes.append(
                f"{found.source['key']} already counted for {item_id}"
                if revision is None
                else f"revision {revision.pk} of {item_id} due {revision.due_at.isoformat()}"
            )
    return outcomes


def revisions_start_due(now: datetime | None = None) -> list[str]:
    """Start every waiting revision due by `now`; one outcome line each."""
    return [revision_start(revision_id, now=now) for revision_id in revisions_due(now)]


def revision_start(revision_id: str, *, now: datetime | None = None) -> str:
    """Start, skip or keep waiting one revision (module docstring); its outcome."""
    now = now or timezone.now()
    revision = (
        WorkItemRevision.objects.select_related("work_item")
        .filter(pk=revision_id, state=RevisionState.WAITING)
        .first()
    )
    if revision is None:
        return f"{revision_id}: not waiting"
    item = revision.work_item
    waits = _waits(revision, item, now)
    if waits is not None:
        return f"{revision.pk}: {waits}"
    budget = max_revisions(item.route_option("max_revisions"))
    rounds = rounds_started(item.pk)
    if budget == 0 or rounds >= budget:
        return f"{revision.pk}: {_give_up(revision, item, rounds, budget)}"
    moved = _pull_request_moved(revision, item)
    if moved is not None:
        if moved.startswith("waits"):
            return f"{revision.pk}: {moved}"
        revision_skip(revision.pk, moved)
        return f"{revision.pk}: {moved}"
    return f"{revision.pk}: {_start(revision, item, rounds + 1, budget, now)}"


def _waits(
    revision: WorkItemRevision, item: WorkflowWorkItem, now: datetime
) -> str | None:
    """Why the revision keeps waiting or is skipped at once (module docstring, "not yet"
    and "over"), None: go on."""
    if revision.due_at > now:
        return f"waits until {revision.due_at.isoformat()}"
    if item.status in ACTIVE_WORK_ITEM_STATUSES or item.status in (
        WorkItemStatus.QUEUED,
        WorkItemStatus.DEFERRED,
    ):
        return WAITS_FOR_RUN.format(run_id=item.workflow_run_id or "-")
    if item.status in (WorkItemStatus.CANCELLED, WorkItemStatus.NEEDS_HUMAN):
        reason = SKIP_ITEM_OVER.format(status=item.status)
        revision_skip(revision.pk, reason)
        return reason
    return None


def _give_up(
    revision: WorkItemRevision, item: WorkflowWorkItem, rounds: int, budget: int
) -> str:
    """The budget is spent (or off): skip the revision; a verdict's, or any once rounds
    ran, sends the item to a human (module docstring, "the budget")."""
    if budget == 0 and revision.trigger != RevisionTrigger.VERDICT:
        revision_skip(revision.pk, SKIP_OFF)
        return SKIP_OFF
    reason = (
        OFF_VERDICT
        if budget == 0
        else BUDGET_SPENT.format(rounds=rounds, budget=budget, trigger=revision.trigger)
    )
    revision_skip(revision.pk, f"skipped: {reason}")
    needs_human(item.pk, reason)
    return f"needs a human: {reason}"


def _pull_request_moved(
    revision: WorkItemRevision, item: WorkflowWorkItem
) -> str | None:
    """Why a revision of a delivered pull request does not start (merged, closed, a head
    loopsweb did not push), "waits: ..." when the forge could not say; None: go on."""
    delivered = item_pull_request(item.pk)
    if delivered is None:
        return None
    record = delivered[1]
    pr = record["pr"]
    try:
        now = get_pull_request(str(pr["repo"]), int(pr["number"]))
    except (ForgeError, ApplicationError) as exc:
        return FORGE_UNREACHED.format(error=exc)
    if now.state != "open":
        return PR_CLOSED.format(number=now.number, state=now.state)
    pushed = record.get("commit")
    if now.head_sha and pushed and now.head_sha != pushed:
        return PR_HEAD_MOVED.format(
            number=now.number, head=now.head_sha[:12], pushed=str(pushed)[:12]
        )
    return None


def _start(
    revision: WorkItemRevision,
    item: WorkflowWorkItem,
    round: int,
    budget: int,
    now: datetime,
) -> str:
    """Re-admit the item with its stored route and bind the revision (module docstring,
    "started"): one transaction."""
    reason = REVISION_REASON.format(
        round=round, budget=budget, trigger=revision.trigger
    )
    try:
        with transaction.atomic():
            locked = (
                WorkItemRevision.objects.select_for_update()
                .filter(pk=revision.pk, state=RevisionState.WAITING)
                .first()
            )
            if locked is None:
                return "not waiting"
            after = retry_work_item(item_id=item.pk, reason=reason, now=now)
            admitted = after.status == WorkItemStatus.ADMITTED
            revision_started(
                locked, round=round, run_id=after.workflow_run_id if admitted else None
            )
    except LedgerError as exc:
        # The item was admitted meanwhile (a drain, an operator): the round waits for
        # that run's end, as any revision does.
        return f"waits: {exc}"
    except ApplicationError as exc:
        revision_skip(revision.pk, f"skipped: {exc}")
        return f"skipped: {exc}"
    outcome = (
        f"run {after.workflow_run_id}"
        if admitted
        else f"{after.status} ({after.reason_code}): {after.last_reason}"
    )
    return STARTED.format(round=round, budget=budget, outcome=outcome)
