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

from django.db import connection
from django.db.models import Count

from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
)


@dataclass(frozen=True)
class ActiveCounts:
    scope: int
    project: int
    project_group: int | None


_ACTIVE_SQL = f'SELECT COUNT(*) FROM "{WorkflowWorkItem._meta.db_table}" WHERE "status" IN (%s, %s)'


def active_counts(
    *, scope: str | None, project_key: str | None, project_group: str | None
) -> ActiveCounts:
    """Active (admitted or running) work items per cap dimension, in one round trip.

    - scope: items whose route_scope equals `scope` (NULL-scope rows never count); with no
      scope, every active item (upstream's unscoped global count).
    - project: items of `project_key` across all routes (0 with no key).
    - project_group: items of the group across all routes; None when no group is set.
    One SELECT of scalar subqueries; each is served by its own (column, status) index.
    """
    active = [str(s) for s in ACTIVE_WORK_ITEM_STATUSES]
    parts: list[str] = []
    params: list[str] = []
    for column, value in (
        ("route_scope", scope),
        ("project_key", project_key),
        ("project_group", project_group),
    ):
        if value:
            parts.append(f'({_ACTIVE_SQL} AND "{column}" = %s)')
            params += [*active, value]
        elif column == "route_scope":
            parts.append(f"({_ACTIVE_SQL})")
            params += active
        else:
            parts.append("NULL")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}", params)
        scope_n, project_n, group_n = cursor.fetchone()
    return ActiveCounts(
        scope=scope_n,
        project=project_n or 0,
        project_group=group_n if project_group else None,
    )


@dataclass(frozen=True)
class AccountLoad:
    """Per-account load: running steps, plus reserved steps of admitted runs not yet started."""

    running: dict[str, int] = field(default_factory=dict)
    reserved: dict[str, int] = field(default_factory=dict)

    def total(self) -> dict[str, int]:
        return dict(Counter(self.running) + Counter(self.reserved))


# Reserved load in one pass over the steps of queued/running runs (few: bounded by the caps),
# with window functions instead of a correlated subquery per step:
# - rn = 1 marks each run's first account-carrying step;
# - started > 0 marks a run that has begun a step (its later steps reserve nothing).
_RESERVED_SQL = f"""
SELECT account_profile, COUNT(*) FROM (
    SELECT s.account_profile, s.status,
           ROW_NUMBER() OVER (
               PARTITION BY s.workflow_run_id
               ORDER BY CASE WHEN s.account_profile IS NULL THEN 1 ELSE 0 END, s.sequence
           ) AS rn,
           SUM(CASE WHEN s.status <> %s THEN 1 ELSE 0 END) OVER (
               PARTITION BY s.workflow_run_id
           ) AS started
    FROM "{WorkflowStepRun._meta.db_table}" s
    JOIN "{WorkflowRun._meta.db_table}" r ON r.id = s.workflow_run_id
    WHERE r.status IN (%s, %s)
) firsts
WHERE rn = 1 AND started = 0 AND account_profile IS NOT NULL AND status = %s
GROUP BY account_profile
"""


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
    with connection.cursor() as cursor:
        cursor.execute(
            _RESERVED_SQL,
            [
                str(StepStatus.PENDING),
                str(RunStatus.QUEUED),
                str(RunStatus.RUNNING),
                str(StepStatus.PENDING),
            ],
        )
        reserved = dict(cursor.fetchall())
    return AccountLoad(running=running, reserved=reserved)


def cooling_accounts(*, now: datetime) -> dict[str, datetime]:
    """Accounts cooling down after a provider rate limit, with the time each one frees."""
    return dict(
        AccountCooldown.objects.filter(until__gt=now).values_list(
            "account_profile", "until"
        )
    )
