"""Statuses and choices, with upstream's values (docs/upstream.md §1), and the status sets the
layers above share."""

from __future__ import annotations

from django.db import models


class WorkItemStatus(models.TextChoices):
    QUEUED = "queued"
    DEFERRED = "deferred"
    ADMITTED = "admitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTER = "dead_letter"
    CANCELLED = "cancelled"


# Active work occupies a cap slot (docs/upstream.md §1.2).
ACTIVE_WORK_ITEM_STATUSES = (WorkItemStatus.ADMITTED, WorkItemStatus.RUNNING)
# Statuses an upsert never changes and an early dedupe stops on (docs/upstream.md §2.4, §3.2.9).
KEEP_WORK_ITEM_STATUSES = (
    WorkItemStatus.SUCCEEDED,
    WorkItemStatus.ADMITTED,
    WorkItemStatus.RUNNING,
    WorkItemStatus.FAILED,
    WorkItemStatus.DEAD_LETTER,
    WorkItemStatus.CANCELLED,
)
TERMINAL_WORK_ITEM_STATUSES = (
    WorkItemStatus.SUCCEEDED,
    WorkItemStatus.FAILED,
    WorkItemStatus.DEAD_LETTER,
    WorkItemStatus.CANCELLED,
)


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
