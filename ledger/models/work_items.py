"""The admission queue (work items) and the record of each deferral."""

from __future__ import annotations

from typing import Any

from django.db import models

from ledger.models.base import TimestampedModel, id_field
from ledger.models.loops import Loop
from ledger.models.runs import WorkflowRun
from ledger.models.specs import WorkflowInvocation, WorkflowSpec
from ledger.models.statuses import WorkItemStatus


class WorkflowWorkItem(TimestampedModel):
    """The admission queue: one row per (route_key, idempotency_key)."""

    id = id_field()
    route_key = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=500)
    invocation = models.ForeignKey(
        WorkflowInvocation,
        on_delete=models.CASCADE,
        db_index=False,
        related_name="work_items",
    )
    source_type = models.CharField(max_length=200)
    source_ref = models.CharField(max_length=500)
    subject_ref = models.CharField(max_length=500)
    project_key = models.TextField(null=True, blank=True)
    project_group = models.CharField(max_length=200, null=True, blank=True)
    # Added by 0002 (upstream 0008): the identity that scopes --max-active. NULL on rows written
    # before it existed; those never count toward a scoped total.
    route_scope = models.CharField(max_length=200, null=True, blank=True)
    priority = models.IntegerField(default=0)
    status = models.CharField(
        max_length=20, choices=WorkItemStatus.choices, default=WorkItemStatus.QUEUED
    )
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    workflow = models.ForeignKey(
        WorkflowSpec,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="work_items",
    )
    loop = models.ForeignKey(
        Loop,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="work_items",
    )
    workflow_run = models.ForeignKey(
        WorkflowRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="+",
    )
    last_reason = models.TextField(null=True, blank=True)
    # loopsweb (0003): the stable code of the last deferral (route_cap, project_cap, group_cap,
    # profile_cap, cooldown), kept beside upstream's human last_reason.
    reason_code = models.CharField(max_length=40, null=True, blank=True)
    # loopsweb (0016): the route of the last admission decision ({"kind", "options",
    # "event"}: routing.admission.plan.stored_route), what an operator's retry
    # re-admits with. NULL on rows written before it.
    route_options_json = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "workflow_work_items"
        constraints = [
            # dedupe: one item per (route, idempotency key); the upsert's conflict target
            models.UniqueConstraint(
                fields=["route_key", "idempotency_key"],
                name="workflow_work_items_route_key_idempotency_key_key",
            ),
        ]
        indexes = [
            # `routes list --status`: ordered priority DESC, created_at ASC within a status
            models.Index(
                fields=["status", "next_attempt_at", "-priority", "created_at"],
                name="idx_workflow_work_items_status_next",
            ),
            # the per-project cap count: active items of one project, across routes
            models.Index(
                fields=["project_key", "status"], name="idx_workflow_work_items_project"
            ),
            # the per-group cap count: active items of one project group, across routes
            models.Index(
                fields=["project_group", "status"], name="idx_workflow_work_items_group"
            ),
            # items of one invocation (refresh, cascades)
            models.Index(
                fields=["invocation"], name="idx_workflow_work_items_invocation"
            ),
            # the --max-active count: active items of one route scope. Created only by
            # migration 0002, never in 0001 (older databases lack the column at 0001).
            models.Index(
                fields=["route_scope", "status"], name="idx_workflow_work_items_scope"
            ),
            # the child side of the workflow_run foreign key (0008): SQLite looks up the
            # items naming a run when a run is inserted after its item (a batched
            # admission) and when a run is deleted; without it each lookup reads every item
            models.Index(fields=["workflow_run"], name="idx_workflow_work_items_run"),
        ]

    def __str__(self) -> str:
        # the idempotency key already starts with the route key (`todos-task:T-1`)
        return f"{self.idempotency_key} [{self.status}]"

    def route_option(self, name: str) -> Any:
        """The value of option `name` in the route the item stores (`route_options_json`'s
        `options`, as admission validated it), None when it stores none or not that one."""
        route = self.route_options_json
        options = route.get("options") if isinstance(route, dict) else None
        return options.get(name) if isinstance(options, dict) else None

    def unbind(self) -> None:
        """Forget the spec, loop and run that last took the item, and its lease (in memory;
        the caller sets the status and saves): what an item that waits to be admitted
        again carries (docs/upstream.md §2.1)."""
        self.workflow = None
        self.loop = None
        self.workflow_run = None
        self.lease_expires_at = None

    def requeue(self, reason: str) -> None:
        """Back to `queued` to be admitted again (docs/upstream.md §2.1 requeue, 0.4.12): unbound,
        no next attempt, `last_reason` = `reason`, no reason code; attempts kept (the next
        admission makes them N+1). Saves the row."""
        self.status = WorkItemStatus.QUEUED
        self.unbind()
        self.next_attempt_at = None
        self.last_reason = reason
        self.reason_code = None
        self.save()


class WorkItemDeferral(models.Model):
    """loopsweb (0003): one row per deferral, with what the decision saw.

    Answers "why did this item wait yesterday?": the reason code, upstream's human reason, and
    the counts and limits (and account loads, for pool deferrals) read inside the deciding
    transaction.
    """

    id = id_field()
    work_item = models.ForeignKey(
        WorkflowWorkItem,
        on_delete=models.CASCADE,
        db_index=False,
        related_name="deferrals",
    )
    reason_code = models.CharField(max_length=40)
    reason = models.TextField()
    route_scope = models.CharField(max_length=200, null=True, blank=True)
    project_key = models.TextField(null=True, blank=True)
    project_group = models.CharField(max_length=200, null=True, blank=True)
    counts_json = models.JSONField(default=dict)
    limits_json = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "workflow_work_item_deferrals"
        indexes = [
            # one item's deferral history, oldest first (item page, API detail)
            models.Index(
                fields=["work_item", "created_at"], name="idx_wi_deferrals_item"
            ),
            # deferrals by reason over time (ops overview, metrics)
            models.Index(
                fields=["reason_code", "created_at"], name="idx_wi_deferrals_reason"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reason_code}: {self.reason}"
