"""Loops (a schedule and a target) and their runs."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.base import TimestampedModel, id_field
from ledger.models.statuses import CatchUp, LoopRunStatus, LoopStatus, Overlap


class Loop(TimestampedModel):
    id = id_field()
    name = models.CharField(max_length=500)
    description = models.TextField(null=True, blank=True)
    status = models.CharField(
        max_length=20, choices=LoopStatus.choices, default=LoopStatus.ACTIVE
    )
    archived_at = models.DateTimeField(null=True, blank=True)
    archived_from_status = models.CharField(max_length=20, null=True, blank=True)
    schedule_json = models.JSONField()
    target_json = models.JSONField()
    goal_json = models.JSONField(null=True, blank=True)
    machine_json = models.JSONField(null=True, blank=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    retry_scheduled_for = models.DateTimeField(null=True, blank=True)
    catch_up = models.CharField(
        max_length=10, choices=CatchUp.choices, default=CatchUp.LATEST
    )
    catch_up_limit = models.IntegerField(default=50)
    overlap = models.CharField(
        max_length=10, choices=Overlap.choices, default=Overlap.SKIP
    )
    max_attempts = models.IntegerField(default=1)
    retry_delay_ms = models.IntegerField(default=60_000)
    lease_ms = models.IntegerField(default=1_800_000)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "loops"
        indexes = [
            # the scheduler's "due loops" scan
            models.Index(
                fields=["status", "next_run_at"], name="idx_loops_status_next"
            ),
            # look-up by name (loop names are not unique)
            models.Index(fields=["name"], name="idx_loops_name"),
        ]

    def __str__(self) -> str:
        return self.name


class LoopRun(TimestampedModel):
    id = id_field()
    loop = models.ForeignKey(
        Loop, on_delete=models.CASCADE, db_index=False, related_name="runs"
    )
    loop_name = models.CharField(max_length=500, null=True, blank=True)
    scheduled_for = models.DateTimeField()
    attempt = models.IntegerField(default=1)
    status = models.CharField(max_length=20, choices=LoopRunStatus.choices)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    claim_token = models.CharField(max_length=64, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    pgid = models.IntegerField(null=True, blank=True)
    process_started_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)
    stdout = models.TextField(null=True, blank=True)
    stderr = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    goal_run_id = models.CharField(max_length=32, null=True, blank=True)

    class Meta:
        db_table = "loop_runs"
        constraints = [
            models.UniqueConstraint(
                fields=["loop", "scheduled_for"],
                name="loop_runs_loop_id_scheduled_for_key",
            ),
        ]
        indexes = [
            # a loop's run history, newest last
            models.Index(fields=["loop", "created_at"], name="idx_runs_loop"),
            # runs by status (running runs for the ops pages)
            models.Index(fields=["status"], name="idx_runs_status"),
            # lease recovery: running runs whose lease expired
            models.Index(
                fields=["status", "lease_expires_at"], name="idx_runs_status_lease"
            ),
            # due-run scans by schedule time
            models.Index(fields=["scheduled_for"], name="idx_runs_scheduled"),
            # claim look-up by token (only claimed rows carry one)
            models.Index(
                fields=["claim_token"],
                condition=Q(claim_token__isnull=False),
                name="idx_runs_claim_token",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.loop_name or self.loop_id} @ {self.scheduled_for:%Y-%m-%dT%H:%M:%SZ}"
