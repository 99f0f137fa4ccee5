"""Bounded trust in what a step prints about its account (issue 58; docs/windows.md, "What a
task may claim"): the shared pieces of the bound and of the confirmation.

1. A task is its work item (all its runs and retries), or the run itself when it has none.
   One task puts at most one account into cooldown, at most one into `login failed` and at
   most one into an exhausted window (`KINDS`). A second account reporting the same for the
   same task is not marked: the task is parked (`PARKED_REASONS`, event `task_parked`).
2. A cooldown or exhausted window a step claims for longer than `UNCONFIRMED_LONGEST` is
   recorded for that long only, its reason or source saying "unconfirmed", and loopsweb's
   own smallest request with the account (as `account check` makes it) is queued
   (`confirm_enqueue`, django-q2 task `CONFIRM_TASK`, ledger.services.confirm): when the
   provider itself answers with a rate limit, the claim stands (still under the caps);
   otherwise the 15 minutes are all it gets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django_q.tasks import async_task

from ledger.hosts import host_queue
from ledger.models import WorkflowRun, WorkflowStepRun

logger = logging.getLogger(__name__)

COOLDOWN = "cooldown"
LOGIN = "login"
WINDOW = "window"
KINDS = (COOLDOWN, LOGIN, WINDOW)

MARKED_EVENT = "account_marked"  # the task's one account of a kind
PARKED_EVENT = "task_parked"  # a second account's report, not marked
TASK_PARKED = "task_parked"  # the code, in the event's payload

UNCONFIRMED_LONGEST = timedelta(minutes=15)
CONFIRM_TASK = "ledger.tasks.confirm_account_claim"

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
    """The runs of `run`'s task (rule 1), as a queryset of ids."""
    if run.work_item_id:
        return WorkflowRun.objects.filter(work_item_id=run.work_item_id).values("id")
    return WorkflowRun.objects.filter(pk=run.pk).values("id")


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
