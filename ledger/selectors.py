"""Reads of the ledger that decisions depend on. Counts come from rows, never from counters.

Each count is its own indexed query so that the cost stays flat as history grows:
  - scope:   idx_workflow_work_items_scope   (route_scope, status)
  - project: idx_workflow_work_items_project (project_key, status)
  - group:   idx_workflow_work_items_group   (project_group, status)
  - running steps: idx_workflow_step_runs_status; queued runs: idx_workflow_runs_status.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Exists, OuterRef

from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowStepRun,
    WorkflowWorkItem,
)


@dataclass(frozen=True)
class ActiveCounts:
    scope: int
    project: int
    project_group: int | None


def active_counts(
    *, scope: str | None, project_key: str | None, project_group: str | None
) -> ActiveCounts:
    """Active (admitted or running) work items per cap dimension.

    - scope: items whose route_scope equals `scope` (NULL-scope rows never count); with no
      scope, every active item (upstream's unscoped global count).
    - project: items of `project_key` across all routes (0 with no key).
    - project_group: items of the group across all routes; None when no group is set.
    """
    active = WorkflowWorkItem.objects.filter(status__in=ACTIVE_WORK_ITEM_STATUSES)
    scope_n = active.filter(route_scope=scope).count() if scope else active.count()
    project_n = active.filter(project_key=project_key).count() if project_key else 0
    group_n = (
        active.filter(project_group=project_group).count() if project_group else None
    )
    return ActiveCounts(scope=scope_n, project=project_n, project_group=group_n)


@dataclass(frozen=True)
class AccountLoad:
    """Per-account load: running steps, plus reserved steps of admitted runs not yet started."""

    running: dict[str, int] = field(default_factory=dict)
    reserved: dict[str, int] = field(default_factory=dict)

    def total(self) -> dict[str, int]:
        return dict(Counter(self.running) + Counter(self.reserved))


def account_load() -> AccountLoad:
    """Load per account profile, the loopsweb way (load that cannot herd).

    - running: step runs in `running` with an account profile (upstream's count).
    - reserved: for every admitted run that has not started a step yet (still `queued`, or
      claimed by the runner but before its first step starts), its earliest pending step that
      carries an account. Without this, one drain batch could place every item on the same
      idle account before any of them starts.
    Later steps of a started run count only once they run.
    """
    running = dict(
        WorkflowStepRun.objects.filter(
            status=StepStatus.RUNNING, account_profile__isnull=False
        )
        .values_list("account_profile")
        .annotate(n=Count("id"))
        .order_by()
    )
    started = WorkflowStepRun.objects.filter(
        workflow_run_id=OuterRef("workflow_run_id")
    ).exclude(status=StepStatus.PENDING)
    pending = (
        WorkflowStepRun.objects.filter(
            workflow_run__status__in=(RunStatus.QUEUED, RunStatus.RUNNING),
            status=StepStatus.PENDING,
            account_profile__isnull=False,
        )
        .exclude(Exists(started))
        .order_by("workflow_run_id", "sequence")
        .values_list("workflow_run_id", "account_profile")
    )
    reserved: Counter[str] = Counter()
    seen_runs: set[str] = set()
    for run_id, profile in pending:
        if run_id not in seen_runs:
            seen_runs.add(run_id)
            reserved[profile] += 1
    return AccountLoad(running=running, reserved=dict(reserved))


def cooling_accounts(*, now: datetime) -> dict[str, datetime]:
    """Accounts cooling down after a provider rate limit, with the time each one frees."""
    return dict(
        AccountCooldown.objects.filter(until__gt=now).values_list(
            "account_profile", "until"
        )
    )
