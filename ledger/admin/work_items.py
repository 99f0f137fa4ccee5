"""Admins of work items, invocations and workflow specs."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from ledger.admin.actions import (
    CANCEL_ITEMS,
    DEAD_LETTER,
    REQUEUE,
    run_lifecycle_action,
)
from ledger.admin.base import LedgerAdmin, admin_link, changelist_link
from ledger.admin.filters import (
    AccountProfileFilter,
    AgeFilter,
    ProjectFilter,
    ProjectGroupFilter,
    ProviderFilter,
    ReasonCodeFilter,
    RouteKeyFilter,
    RouteScopeFilter,
    SourceKindFilter,
    SubjectKindFilter,
    TemplateFilter,
)
from ledger.models import (
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowWorkItem,
)

# --- admins -----------------------------------------------------------------------------------


@admin.register(WorkflowWorkItem)
class WorkflowWorkItemAdmin(LedgerAdmin):
    list_display = (
        "id",
        "route_key",
        "status",
        "route_scope",
        "project_key",
        "project_group",
        "reason_code",
        "attempts",
        "subject_ref",
        "short_reason",
        "created_at",
    )
    list_filter = (
        "status",
        RouteScopeFilter,
        ProjectFilter,
        ProjectGroupFilter,
        ReasonCodeFilter,
        AccountProfileFilter,
        ProviderFilter,
        AgeFilter,
        RouteKeyFilter,
    )
    search_fields = ("=id", "idempotency_key", "subject_ref", "source_ref")
    list_select_related = ("invocation",)
    raw_id_fields = ("invocation", "workflow", "loop", "workflow_run")
    readonly_fields = (
        "id",
        "ops_link",
        "invocation_link",
        "workflow_run_link",
        "runs_link",
        "workflow_link",
        "loop_link",
    )
    actions = ("requeue_items", "cancel_items", "dead_letter_items")

    @admin.action(description="Requeue selected work items…", permissions=["operate"])
    def requeue_items(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, REQUEUE)

    @admin.action(description="Cancel selected work items…", permissions=["operate"])
    def cancel_items(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, CANCEL_ITEMS)

    @admin.action(
        description="Dead-letter selected work items…", permissions=["operate"]
    )
    def dead_letter_items(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, DEAD_LETTER)

    @admin.display(description="last reason")
    def short_reason(self, obj: WorkflowWorkItem) -> str:
        reason = obj.last_reason or ""
        return reason if len(reason) <= 80 else reason[:79] + "…"

    @admin.display(description="deferral history")
    def ops_link(self, obj: WorkflowWorkItem) -> str:
        url = reverse("ops:work-item", args=[obj.pk])
        return format_html('<a href="{}">why it waited (ops)</a>', url)

    @admin.display(description="invocation")
    def invocation_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.invocation)

    @admin.display(description="workflow")
    def workflow_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.workflow)

    @admin.display(description="loop")
    def loop_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.loop)

    @admin.display(description="workflow run (latest, with its step runs)")
    def workflow_run_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.workflow_run)

    @admin.display(description="all runs")
    def runs_link(self, obj: WorkflowWorkItem) -> str:
        return changelist_link(WorkflowRun, "runs of this item", work_item=obj.pk)


@admin.register(WorkflowInvocation)
class WorkflowInvocationAdmin(LedgerAdmin):
    list_display = (
        "id",
        "source_kind",
        "source_id",
        "source_dedupe_key",
        "subject_kind",
        "subject_id",
        "intent",
        "created_at",
    )
    list_filter = (
        SourceKindFilter,
        SubjectKindFilter,
        "intent",
        TemplateFilter,
        AgeFilter,
    )
    search_fields = ("=id", "source_id", "source_dedupe_key", "subject_id")
    readonly_fields = ("id", "work_items_link", "runs_link")

    @admin.display(description="work items")
    def work_items_link(self, obj: WorkflowInvocation) -> str:
        return changelist_link(WorkflowWorkItem, "work items", invocation=obj.pk)

    @admin.display(description="runs")
    def runs_link(self, obj: WorkflowInvocation) -> str:
        return changelist_link(WorkflowRun, "runs", invocation=obj.pk)


@admin.register(WorkflowSpec)
class WorkflowSpecAdmin(LedgerAdmin):
    list_display = ("id", "name", "version", "status", "updated_at")
    list_filter = ("status",)
    search_fields = ("=id", "name")
