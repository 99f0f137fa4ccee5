"""What a run executes: the invocation (one per routed source event) and the workflow spec."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.base import TimestampedModel, id_field
from ledger.models.statuses import Intent, SpecStatus


class WorkflowInvocation(TimestampedModel):
    """One row per routed source event (per dedupe key)."""

    id = id_field()
    workflow_id = models.CharField(max_length=32, null=True, blank=True)
    template_id = models.CharField(max_length=200, null=True, blank=True)
    source_kind = models.CharField(max_length=50)
    source_id = models.CharField(max_length=500, null=True, blank=True)
    source_dedupe_key = models.CharField(max_length=500, null=True, blank=True)
    source_json = models.JSONField()
    subject_kind = models.CharField(max_length=50)
    subject_id = models.CharField(max_length=500, null=True, blank=True)
    subject_path = models.TextField(null=True, blank=True)
    subject_url = models.TextField(null=True, blank=True)
    subject_json = models.JSONField()
    intent = models.CharField(max_length=20, choices=Intent.choices)
    scope_json = models.JSONField(null=True, blank=True)
    output_policy_json = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "workflow_invocations"
        indexes = [
            # "which invocation came from event X": admin search, drain reports
            models.Index(
                fields=["source_kind", "source_id"],
                name="idx_workflow_invocations_source",
            ),
            # invocations about one task/subject (ops pages, `routes invocations`)
            models.Index(
                fields=["subject_kind", "subject_id", "subject_path"],
                name="idx_workflow_invocations_subject",
            ),
        ]
        constraints = [
            # create-or-get by (source kind, idempotency key) at the start of every admission
            models.UniqueConstraint(
                fields=["source_kind", "source_dedupe_key"],
                condition=Q(source_dedupe_key__isnull=False),
                name="idx_workflow_invocations_dedupe",
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.source_kind}:{self.source_dedupe_key or self.source_id or self.id}"
        )


class WorkflowSpec(TimestampedModel):
    """A workflow definition (upstream calls the table `workflow_specs`; there is no `workflows`)."""

    id = id_field()
    name = models.CharField(max_length=500)
    description = models.TextField(null=True, blank=True)
    version = models.IntegerField(default=1)
    status = models.CharField(
        max_length=20, choices=SpecStatus.choices, default=SpecStatus.ACTIVE
    )
    goal_json = models.JSONField(null=True, blank=True)
    steps_json = models.JSONField()

    class Meta:
        db_table = "workflow_specs"
        indexes = [
            # find the active spec by generated name before reusing it (docs/upstream.md §3.6,
            # "The spec")
            models.Index(fields=["status", "name"], name="idx_workflows_status_name"),
        ]
        constraints = [
            # at most one active spec per name
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(status="active"),
                name="idx_workflows_name_active",
            ),
        ]

    def __str__(self) -> str:
        return self.name
