"""The django-q2 entry points of execution: adapters that decide nothing, each calling the
operation it names (the run's delivery to this host is runs.runner.run_delivered; the
recovery composes the ledger's recoveries with saving what the ended runs left here). Their
dotted paths (`runs.tasks.run_workflow`, …) are stored in schedules and queued tasks (those
written before the move answer through the shim ledger/tasks.py for one release).

How a run's task is queued (the run cluster's queue, hand-back, the broker read) is
`ledger.queue`; this module holds only the entry points.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django_q.conf import Conf
from django_q.tasks import async_task

from ledger.claims import Claim
from ledger.hosts import (
    live_hosts,
)
from ledger.queue import (
    LOST_TASK_AFTER,
    enqueue_run,
    hosts_release_dead,
    runs_with_a_task,
)
from ledger.services import (
    runs_fail_unserved,
    runs_queued_stale,
    runs_recover_expired,
)
from runs.confirm import confirm_claim
from runs.discard import run_branches_prune
from runs.notifications import notification_deliver, notifications_sweep
from runs.run_worktree import save_work_of_ended
from runs.runner import run_delivered
from runs.worktree_prune import worktree_orphans_prune, worktrees_prune

logger = logging.getLogger(__name__)
PRUNE_TASK = "runs.tasks.prune_host_worktrees"


def run_workflow(run_id: str) -> str:
    """django-q2 task: execute one admitted run here (runs.runner.run_delivered)."""
    return run_delivered(run_id, inline=bool(Conf.SYNC))


def confirm_account_claim(claim: dict[str, Any]) -> str:
    """django-q2 task (the run cluster of the host the step ran on): loopsweb's own
    request with an account a step claimed cooling or exhausted for longer than 15 minutes;
    the claim stands only when the provider answers with a rate limit (ledger.claims)."""
    return confirm_claim(Claim.from_dict(claim))


def recover_expired_runs() -> int:
    """django-q2 task (every minute): fail running runs whose worker lease expired (what
    they left uncommitted in a worktree on this host committed on their branch), and hand
    queued or parked runs whose task is gone (dropped, never delivered, row deleted) to the
    run cluster again."""
    hosts_release_dead()
    recovered = runs_recover_expired()
    # What their killed agents left in worktrees on this host, committed on their branches.
    save_work_of_ended(r.run_id for r in recovered)
    runs_fail_unserved(grace=timedelta(seconds=settings.LOOPSWEB_NO_HOST_GRACE_SECONDS))
    for run_id in runs_queued_stale(
        older_than=LOST_TASK_AFTER, with_task=runs_with_a_task()
    ):
        enqueue_run(run_id)
    return len(recovered)


def prune_worktrees() -> int:
    """django-q2 task (periodic, main cluster): each host prunes only what it made, so the
    prune goes to every live host's own queue (`prune_host_worktrees` runs there); with no
    host registered (one machine) it runs here. Returns the hosts asked (or the removals)."""
    hosts = live_hosts(fresh=True)
    if not hosts:
        return prune_host_worktrees()
    for host in hosts:
        async_task(
            PRUNE_TASK, task_name=f"prune-worktrees-{host.name}", cluster=host.queue
        )
    return len(hosts)


def prune_host_worktrees() -> int:
    """django-q2 task (on a host's run cluster): this host's due worktrees (succeeded runs'
    leftovers, failed runs' after LOOPSWEB_WORKTREE_KEEP_SECONDS) and the orphans on its
    disk; the number removed."""
    pruned = [p for p in worktrees_prune() if p.removed]
    orphans = [p for p in worktree_orphans_prune() if p.removed]
    # Run branches that are done with (runs.discard): no changes, or a closed PR.
    branches = [d for d in run_branches_prune() if d.deleted]
    return len(pruned) + len(orphans) + len(branches)


def notifications_send(notification_id: str | None = None, **_q: Any) -> object:
    """django-q2 task (main cluster): one try of a notification (runs.notifications:
    queued when its episode commits, again after each backoff), or, without an id, the
    sweep of the `notifications-send` schedule (every minute): episodes only a look finds,
    then every due row queued."""
    if notification_id is None:
        return notifications_sweep()
    return notification_deliver(notification_id)
