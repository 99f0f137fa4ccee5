"""Ledger admins: the record is history, so these pages read and never write.

Large tables: no full-table COUNT (`show_full_result_count = False` and a paginator whose count
stops at a cap), `list_select_related` for every relation shown, raw id widgets.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from ledger.models import (
    Loop,
    LoopRun,
    WorkflowEvent,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
)

COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    """Counts at most COUNT_CAP rows (`SELECT COUNT(*) FROM (... LIMIT cap)`), so a changelist
    over millions of rows costs a bounded scan; beyond the cap the last page is the cap's."""

    @cached_property
    def count(self) -> int:
        return self.object_list.order_by()[:COUNT_CAP].count()


class LedgerAdmin(admin.ModelAdmin):
    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def admin_link(obj: Any, label: str | None = None) -> str:
    """A link to obj's admin change page ('-' when obj is None)."""
    if obj is None:
        return "-"
    url = reverse(
        f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk]
    )
    return format_html('<a href="{}">{}</a>', url, label or str(obj))


class AccountProfileFilter(admin.SimpleListFilter):
    """Work items whose runs had a step on the chosen account."""

    title = "account profile"
    parameter_name = "account_profile"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        profiles = (
            WorkflowStepRun.objects.exclude(account_profile__isnull=True)
            .order_by("account_profile")
            .values_list("account_profile", flat=True)
            .distinct()[:100]
        )
        return [(p, p) for p in profiles]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        if queryset.model is WorkflowStepRun:
            return queryset.filter(account_profile=value)
        run_ids = WorkflowStepRun.objects.filter(account_profile=value).values(
            "workflow_run_id"
        )
        if queryset.model is WorkflowRun:
            return queryset.filter(id__in=run_ids)
        return queryset.filter(runs__id__in=run_ids).distinct()


@admin.register(WorkflowWorkItem)
class WorkflowWorkItemAdmin(LedgerAdmin):
    list_display = (
        "id",
        "route_key",
        "status",
        "route_scope",
        "project_key",
        "project_group",
        "attempts",
        "subject_ref",
        "short_reason",
        "updated_at",
    )
    list_filter = (
        "status",
        "route_key",
        "route_scope",
        "project_group",
        AccountProfileFilter,
    )
    search_fields = ("=id", "idempotency_key", "subject_ref", "source_ref")
    list_select_related = ("invocation",)
    raw_id_fields = ("invocation", "workflow", "loop", "workflow_run")
    readonly_fields = (
        "id",
        "invocation_link",
        "workflow_link",
        "loop_link",
        "workflow_run_link",
    )
    ordering = ("-created_at",)

    @admin.display(description="last reason")
    def short_reason(self, obj: WorkflowWorkItem) -> str:
        reason = obj.last_reason or ""
        return reason if len(reason) <= 80 else reason[:79] + "…"

    @admin.display(description="invocation")
    def invocation_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.invocation)

    @admin.display(description="workflow")
    def workflow_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.workflow)

    @admin.display(description="loop")
    def loop_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.loop)

    @admin.display(description="workflow run")
    def workflow_run_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.workflow_run)


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
    )
    list_filter = ("source_kind", "subject_kind", "intent", "template_id")
    search_fields = ("=id", "source_id", "source_dedupe_key", "subject_id")
    ordering = ("-created_at",)


@admin.register(WorkflowSpec)
class WorkflowSpecAdmin(LedgerAdmin):
    list_display = ("id", "name", "version", "status", "updated_at")
    list_filter = ("status",)
    search_fields = ("=id", "name")
    ordering = ("-created_at",)


class StepRunInline(admin.TabularInline):
    model = WorkflowStepRun
    fields = (
        "step_id",
        "sequence",
        "status",
        "account_profile",
        "account_tool",
        "exit_code",
        "duration_ms",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ("sequence",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WorkflowRun)
class WorkflowRunAdmin(LedgerAdmin):
    list_display = (
        "id",
        "workflow_name",
        "status",
        "work_item",
        "started_at",
        "finished_at",
        "duration_ms",
    )
    list_filter = ("status", AccountProfileFilter)
    search_fields = ("=id", "workflow_name", "=work_item__id", "idempotency_key")
    list_select_related = ("work_item",)
    raw_id_fields = ("workflow", "loop", "loop_run", "invocation", "work_item")
    inlines = [StepRunInline]
    ordering = ("-created_at",)


@admin.register(WorkflowStepRun)
class WorkflowStepRunAdmin(LedgerAdmin):
    list_display = (
        "id",
        "step_id",
        "status",
        "account_profile",
        "account_tool",
        "workflow_run",
        "exit_code",
        "duration_ms",
        "started_at",
    )
    list_filter = ("status", "account_tool", AccountProfileFilter)
    search_fields = ("=id", "step_id", "=workflow_run__id", "account_profile")
    list_select_related = ("workflow_run",)
    raw_id_fields = ("workflow_run",)
    ordering = ("-created_at",)


@admin.register(WorkflowEvent)
class WorkflowEventAdmin(LedgerAdmin):
    list_display = (
        "id",
        "workflow_run",
        "sequence",
        "event_type",
        "step_id",
        "created_at",
    )
    list_filter = ("event_type",)
    search_fields = ("=id", "=workflow_run__id")
    list_select_related = ("workflow_run",)
    raw_id_fields = ("workflow_run",)
    ordering = ("-created_at",)


@admin.register(Loop)
class LoopAdmin(LedgerAdmin):
    list_display = (
        "id",
        "name",
        "status",
        "next_run_at",
        "max_attempts",
        "lease_ms",
        "updated_at",
    )
    list_filter = ("status",)
    search_fields = ("=id", "name")
    ordering = ("-created_at",)


@admin.register(LoopRun)
class LoopRunAdmin(LedgerAdmin):
    list_display = (
        "id",
        "loop_name",
        "status",
        "attempt",
        "scheduled_for",
        "started_at",
        "exit_code",
    )
    list_filter = ("status",)
    search_fields = ("=id", "loop_name")
    list_select_related = ("loop",)
    raw_id_fields = ("loop",)
    ordering = ("-created_at",)
