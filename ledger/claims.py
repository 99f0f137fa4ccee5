"""Bounded trust in what a step prints about its account (docs/windows.md, "What a
task may claim"): the shared pieces of the bound and of the confirmation.

1. **The bound.** A task is its work item (all its runs and retries), or the run itself when
   it has none.
   One task puts at most one account into cooldown, at most one into `login failed` and at
   most one into an exhausted window (`KINDS`). A second account reporting the same for the
   same task is not marked: the task is parked (`PARKED_REASONS`, event `task_parked`).
   A task parked for a rate limit holds, it does not fail: its next step start waits until
   the hold ends (`task_hold`: the second account's claimed end, or the cooldown backoff
   growing with each such park of the task, never longer than `UNCONFIRMED_LONGEST`), its
   run parked holding no worker, and then runs again. A task parked for a failed login
   ends its run, not retried, until an operator acts (no wait makes a key good again).
2. **The confirmation.** A cooldown or exhausted window a step claims for longer than
   `UNCONFIRMED_LONGEST` is recorded for that long only, its reason or source saying
   "unconfirmed", and loopsweb's own smallest request with the account (as `account check`
   makes it) is queued (`confirm_enqueue`, django-q2 task `CONFIRM_TASK`, runs.confirm):
   when the provider itself answers with a rate limit, the claim stands (still under the
   caps); otherwise the 15 minutes are all it gets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Q
from django.utils import timezone
from django_q.tasks import async_task

from ledger.admissions import admission_start
from ledger.hosts import host_queue
from ledger.models import WorkflowEvent, WorkflowRun, WorkflowStepRun

logger = logging.getLogger(__name__)

COOLDOWN = "cooldown"
LOGIN = "login"
WINDOW = "window"
KINDS = (COOLDOWN, LOGIN, WINDOW)

MARKED_EVENT = "account_marked"  # the task's one account of a kind
PARKED_EVENT = "task_parked"  # a second account's report, not marked
TASK_PARKED = "task_parked"  # the code, in the event's payload

UNCONFIRMED_LONGEST = timedelta(minutes=15)
CONFIRM_TASK = "runs.tasks.confirm_account_claim"

_CHECK = "check the accounts with `account check`"
PARKED_REASONS = {
    COOLDOWN: f"every account this task tried reported a rate limit: {_CHECK}",
    LOGIN: f"every account this task tried reported a failed login: {_CHECK}",
    WINDOW: f"every account this task tried reported an exhausted window: {_CHECK}",
}
UNCONFIRMED_REASON = (
    "unconfirmed for {minutes} min (claimed until {claimed}; loopsweb's own request with "
    "the account confirms or not): {reason}"
)
UNCONFIRMED_SOURCE = "unconfirmed (claimed until {claimed}): {source}"
HELD_REASON = "{reason} (the task waits until {until})"


def unconfirmed_minutes() -> int:
    return int(UNCONFIRMED_LONGEST.total_seconds() // 60)


@dataclass(frozen=True)
class Claim:
    """A claim about an account longer than `UNCONFIRMED_LONGEST`, to be confirmed: a
    cooldown until `until`, or the window `window` (Window.to_dict) exhausted until then."""

    account: str
    kind: str  # COOLDOWN or WINDOW
    until: datetime
    reason: str
    tool: str | None = None
    window: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "account": self.account,
            "kind": self.kind,
            "until": self.until.isoformat(),
            "reason": self.reason,
            "tool": self.tool,
            "window": self.window,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Claim:
        return cls(
            account=str(data["account"]),
            kind=str(data["kind"]),
            until=datetime.fromisoformat(str(data["until"])),
            reason=str(data.get("reason") or ""),
            tool=data.get("tool"),
            window=data.get("window"),
        )


def task_runs(run: WorkflowRun) -> Any:
    """The runs of `run`'s task ("the bound", module docstring), as a queryset of ids: its
    work item's runs since the item's last admission or operator retry (ledger.admissions,
    the notion the re-dispatch count uses: an operator's retry starts the bound afresh), and
    `run`."""
    if run.work_item_id:
        runs = WorkflowRun.objects.filter(work_item_id=run.work_item_id)
        start = admission_start(run.work_item_id)
        if start is not None:
            runs = runs.filter(Q(id__gte=start) | Q(pk=run.pk))
        return runs.values("id")
    return WorkflowRun.objects.filter(pk=run.pk).values("id")


def task_hold(run: WorkflowRun, now: datetime) -> tuple[str, datetime] | None:
    """The hold of `run`'s task ("the bound", module docstring) in force at `now`: the
    waiting reason and its end, from the latest end of its `task_parked` events of a rate
    limit; None when none holds. Read at every step start: one query when the item's runs
    never parked it."""
    parks = WorkflowEvent.objects.filter(event_type=PARKED_EVENT)
    parks = (
        parks.filter(workflow_run__work_item_id=run.work_item_id)
        if run.work_item_id
        else parks.filter(workflow_run_id=run.pk)
    )
    found = list(parks.values_list("workflow_run_id", "payload_json"))
    if not found:
        return None
    runs = set(task_runs(run).values_list("id", flat=True))
    until = None
    for run_id, payload in found:
        if run_id not in runs or not isinstance(payload, dict):
            continue
        if payload.get("kind") != COOLDOWN:
            continue
        try:
            end = datetime.fromisoformat(str(payload.get("until")))
        except ValueError:
            continue
        if end > now and (until is None or end > until):
            until = end
    if until is None:
        return None
    return held_reason(until), until


def held_reason(until: datetime) -> str:
    """What a task held after a rate limit says (on its waiting step and its item)."""
    return HELD_REASON.format(
        reason=PARKED_REASONS[COOLDOWN],
        until=timezone.localtime(until).strftime("%H:%M:%S"),
    )


def confirm_enqueue(claim: Claim, *, step_run_id: str | None) -> None:
    """Queue the confirmation of `claim` on the run cluster of the host the step ran on
    (the account's home is there), or the shared run queue. Never raises: an unqueued
    confirmation leaves the claim at its 15 minutes."""
    host = (
        WorkflowStepRun.objects.filter(pk=step_run_id)
        .values_list("workflow_run__host", flat=True)
        .first()
        if step_run_id
        else None
    )
    queue = host_queue(host) if host else settings.LOOPSWEB_RUN_CLUSTER
    try:
        async_task(
            CONFIRM_TASK,
            claim.to_dict(),
            task_name=f"confirm-{claim.kind}-{claim.account}"[:100],
            cluster=queue,
        )
    except (DatabaseError, OSError):
        logger.exception("could not queue the confirmation of %s", claim.account)
