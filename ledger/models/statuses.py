"""Statuses and choices, with upstream's values (docs/upstream.md §1), and the status sets the
layers above share."""

from __future__ import annotations

from django.db import models

from domain.statuses import (
    ACTIVE_WORK_ITEM_STATES,
    TERMINAL_WORK_ITEM_STATES,
    UNCLEARED_WORK_ITEM_STATES,
    WorkItemState,
)


class WorkItemStatus(models.TextChoices):
    """The model's choices of domain.statuses.WorkItemState (one member each, same names
    and values: tests/ledger/test_statuses.py)."""

    QUEUED = WorkItemState.QUEUED.value
    DEFERRED = WorkItemState.DEFERRED.value
    ADMITTED = WorkItemState.ADMITTED.value
    RUNNING = WorkItemState.RUNNING.value
    SUCCEEDED = WorkItemState.SUCCEEDED.value
    FAILED = WorkItemState.FAILED.value
    DEAD_LETTER = WorkItemState.DEAD_LETTER.value
    CANCELLED = WorkItemState.CANCELLED.value
    NEEDS_HUMAN = WorkItemState.NEEDS_HUMAN.value, "needs human"


def _work_item_statuses(states: frozenset[str]) -> tuple[WorkItemStatus, ...]:
    return tuple(status for status in WorkItemStatus if status in states)


# Active work occupies a cap slot (docs/upstream.md §1.2).
ACTIVE_WORK_ITEM_STATUSES = _work_item_statuses(ACTIVE_WORK_ITEM_STATES)
# Statuses an upsert never changes and an early dedupe stops on (docs/upstream.md §2.4, §3.2.9).
KEEP_WORK_ITEM_STATUSES = _work_item_statuses(UNCLEARED_WORK_ITEM_STATES)
TERMINAL_WORK_ITEM_STATUSES = _work_item_statuses(TERMINAL_WORK_ITEM_STATES)


class RunStatus(models.TextChoices):
    # `queued` is ours: admitted, not yet claimed by the runner. Upstream creates runs `running`.
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


TERMINAL_RUN_STATUSES = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.TIMED_OUT,
    RunStatus.CANCELLED,
)


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class StepReasonCode(models.TextChoices):
    """Why a finished step did not succeed, as the runner recorded it (`reason_code`, 0022):
    counted by /metrics and the account pages, so no count reads the error's wording."""

    NONE = "", "none"
    RATE_LIMITED = "rate_limited", "rate limited"
    LOGIN_FAILED = "login_failed", "login failed"
    FAILED = "failed", "failed"  # any other failure (failed or timed out)


class SpecStatus(models.TextChoices):
    ACTIVE = "active"
    ARCHIVED = "archived"


class LoopStatus(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"
    STOPPED = "stopped"
    EXPIRED = "expired"


class LoopRunStatus(models.TextChoices):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    ABANDONED = "abandoned"
    SKIPPED = "skipped"


class Intent(models.TextChoices):
    ROUTE = "route"
    MUTATE = "mutate"
    REVIEW = "review"
    EVALUATE = "evaluate"
    REPORT = "report"


class CatchUp(models.TextChoices):
    NONE = "none"
    LATEST = "latest"
    ALL = "all"


class Overlap(models.TextChoices):
    SKIP = "skip"
    ALLOW = "allow"
