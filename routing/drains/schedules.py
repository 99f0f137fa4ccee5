"""Every built-in django-q2 schedule, declared as data.

`python manage.py sync_schedules` upserts these by name (run by `make run` and on every
deploy). Operator drains made with `schedule_drain` are separate rows and are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    func: str
    minutes: int


SCHEDULES: tuple[ScheduleSpec, ...] = (
    # Runs whose worker died stop pinning accounts and cap slots within a minute of their
    # lease expiring (LOOPSWEB_RUN_LEASE_SECONDS).
    ScheduleSpec(
        name="recover-expired-runs",
        func="runs.tasks.recover_expired_runs",
        minutes=1,
    ),
    # Drain records that did nothing (one a minute per idle schedule) are kept
    # LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS days.
    ScheduleSpec(
        name="prune-empty-drains",
        func="routing.tasks.prune_empty_drains",
        minutes=60,
    ),
    # Revisions whose start was lost or waited (a forge that could not be read, an item
    # whose run was on) start within a minute of being due (routing.revisions).
    ScheduleSpec(
        name="revisions-due",
        func="routing.tasks.revisions_due",
        minutes=1,
    ),
    # The webhook's polling fallback: open pull requests loopsweb opened, read with
    # conditional requests (an idle pass costs no rate limit); nothing without a token.
    ScheduleSpec(
        name="github-sync",
        func="routing.tasks.github_sync",
        minutes=5,
    ),
    # Failed runs' worktrees are kept LOOPSWEB_WORKTREE_KEEP_SECONDS for an operator to look
    # at; this removes them after that (and any a succeeded run could not remove).
    ScheduleSpec(
        name="prune-worktrees",
        func="runs.tasks.prune_worktrees",
        minutes=15,
    ),
    # Notifications (docs/operations.md "Notifications"): the due ones sent again (a lost
    # task, a restart, a retry's backoff), and the episodes only a look finds.
    ScheduleSpec(
        name="notifications-send",
        func="runs.tasks.notifications_send",
        minutes=1,
    ),
)
