"""Admins of work items, invocations and workflow specs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from agents.agent_output import strip_ansi, summarize_output
from domain.controls import terminal_lines
from ledger import services
from ledger.admin.actions import (
    CANCEL_ITEMS,
    DEAD_LETTER,
    REQUEUE,
    RETRY_ITEMS,
    action_history,
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
from ledger.display import attempts_story, step_usage
from ledger.item_read import work_item_read
from ledger.models import (
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.webkit.access import RUNS, STEPS, may_view
from ledger.webkit.cells import (
    age,
    current_state,
    project_basename,
    seconds,
    short_id,
    status_badge,
    task_description,
    task_title,
)

# --- admins -----------------------------------------------------------------------------------

# Items whose reason cell shows the error their run ended with.
FAILED_ITEM_STATES = (WorkItemStatus.FAILED, WorkItemStatus.DEAD_LETTER)


class WorkItemChangeList(ChangeList):
    """The page's rows with the accounts their latest runs' steps use, read in one query
    for the whole page (a column per row would be a query per row)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        accounts: dict[str, list[str]] = {}
        run_ids = [r.workflow_run_id for r in rows if r.workflow_run_id]
        if run_ids:
            steps = (
                WorkflowStepRun.objects.filter(
                    workflow_run_id__in=run_ids, account_profile__isnull=False
                )
                .order_by("sequence")
                .values_list("workflow_run_id", "account_profile")
            )
            for run_id, profile in steps:
                known = accounts.setdefault(run_id, [])
                if profile is not None and profile not in known:
                    known.append(profile)
        for row in rows:
            row.accounts = accounts.get(row.workflow_run_id or "", [])
        self.result_list = rows


@admin.register(WorkflowWorkItem)
class WorkflowWorkItemAdmin(LedgerAdmin):
    # The columns an operator reads first, narrow enough for 1400 px: full ids,
    # paths and reasons are on hover.
    list_display = (
        "short_id_cell",
        "title_cell",
        "status_cell",
        "project_cell",
        "route_scope",
        "reason_cell",
        "accounts_cell",
        "attempts",
        "age_cell",
        "duration_cell",
    )
    list_display_links = ("short_id_cell", "title_cell")
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
    list_select_related = ("invocation", "workflow_run")
    raw_id_fields = ("invocation", "workflow", "loop", "workflow_run")
    change_form_template = "admin/ledger/workflowworkitem/change_form.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "title_text",
                    "description_text",
                    ("status_cell", "state_text"),
                    "last_reason",
                    ("reason_code", "attempts", "priority"),
                )
            },
        ),
        (
            "Route",
            {
                "fields": (
                    ("route_key", "route_scope"),
                    ("project_key", "project_group"),
                    ("subject_ref", "source_type", "source_ref"),
                    "idempotency_key",
                )
            },
        ),
        (
            "Times (UTC)",
            {
                "fields": (
                    ("created_at", "updated_at"),
                    ("next_attempt_at", "lease_expires_at"),
                )
            },
        ),
        (
            "Links",
            {
                "fields": (
                    "id",
                    ("invocation_link", "workflow_link", "loop_link"),
                    ("workflow_run_link", "runs_link", "ops_link"),
                )
            },
        ),
    )
    readonly_fields = (
        "id",
        "title_text",
        "description_text",
        "status_cell",
        "state_text",
        "ops_link",
        "invocation_link",
        "workflow_run_link",
        "runs_link",
        "workflow_link",
        "loop_link",
    )
    actions = ("requeue_items", "retry_items", "cancel_items", "dead_letter_items")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return WorkItemChangeList

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The page is read-only: every model field is shown as text, never as a widget.
        names = [f.name for f in self.model._meta.concrete_fields]
        return (*self.readonly_fields, *(n for n in names if n != "id"))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        item = (
            WorkflowWorkItem.objects.select_related("invocation", "workflow_run")
            .filter(pk=object_id)
            .first()
        )
        context = dict(extra_context or {})
        if item is not None:
            context.update(item_page_context(self, request, item))
        return super().change_view(request, object_id, form_url, context)

    @admin.action(description="Requeue selected work items…", permissions=["operate"])
    def requeue_items(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, REQUEUE)

    @admin.action(description="Retry selected work items…", permissions=["operate"])
    def retry_items(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, RETRY_ITEMS)

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

    # --- list cells -------------------------------------------------------------------------

    @admin.display(description="id", ordering="-id")
    def short_id_cell(self, obj: WorkflowWorkItem) -> str:
        return short_id(obj.id)

    @admin.display(description="title / subject")
    def title_cell(self, obj: WorkflowWorkItem) -> str:
        subject = obj.invocation.subject_json if obj.invocation_id else None
        title = task_title(subject, obj.subject_ref)
        text = title if len(title) <= 70 else title[:69] + "…"
        return format_html('<span title="{}">{}</span>', obj.subject_ref, text)

    @admin.display(description="status", ordering="status")
    def status_cell(self, obj: WorkflowWorkItem) -> str:
        return status_badge(obj.status)

    @admin.display(description="project")
    def project_cell(self, obj: WorkflowWorkItem) -> str:
        return project_basename(obj.project_key)

    @admin.display(description="reason")
    def reason_cell(self, obj: WorkflowWorkItem) -> str:
        """The deferral's reason code; for an item that failed, the error its run ended
        with (the failed step's, shortened; whole on hover)."""
        text = self._state(obj)
        shown = obj.reason_code or "-"
        run = obj.workflow_run if obj.workflow_run_id else None
        if obj.reason_code is None and obj.status in FAILED_ITEM_STATES:
            error = (run.error if run else None) or obj.last_reason or ""
            if error:
                shown = error if len(error) <= 60 else error[:59] + "…"
        return format_html('<span title="{}">{}</span>', text, shown)

    @admin.display(description="accounts")
    def accounts_cell(self, obj: WorkflowWorkItem) -> str:
        return ", ".join(getattr(obj, "accounts", [])) or "-"

    @admin.display(description="age", ordering="-id")
    def age_cell(self, obj: WorkflowWorkItem) -> str:
        return format_html(
            '<span title="{}">{}</span>',
            f"{obj.created_at:%Y-%m-%d %H:%M:%S} UTC",
            age(obj.created_at, timezone.now()),
        )

    @admin.display(description="duration")
    def duration_cell(self, obj: WorkflowWorkItem) -> str:
        run = obj.workflow_run if obj.workflow_run_id else None
        if run is None:
            return ""
        if run.duration_ms is None and run.started_at:
            return format_html(
                '<span class="lw-live">{}</span>',
                seconds(int((timezone.now() - run.started_at).total_seconds() * 1000)),
            )
        return seconds(run.duration_ms)

    # --- page cells -------------------------------------------------------------------------

    def _state(self, obj: WorkflowWorkItem) -> str:
        run = obj.workflow_run if obj.workflow_run_id else None
        return current_state(
            status=obj.status,
            last_reason=obj.last_reason,
            run_id=obj.workflow_run_id,
            run_status=run.status if run else None,
            run_finished_at=run.finished_at if run else None,
            run_error=run.error if run else None,
        )

    @admin.display(description="now")
    def state_text(self, obj: WorkflowWorkItem) -> str:
        return self._state(obj)

    @admin.display(description="title")
    def title_text(self, obj: WorkflowWorkItem) -> str:
        subject = obj.invocation.subject_json if obj.invocation_id else None
        return task_title(subject, obj.subject_ref)

    @admin.display(description="description")
    def description_text(self, obj: WorkflowWorkItem) -> str:
        subject = obj.invocation.subject_json if obj.invocation_id else None
        return task_description(subject) or "-"

    @admin.display(description="deferral history")
    def ops_link(self, obj: WorkflowWorkItem) -> str:
        url = reverse("ops:work-item", args=[obj.pk])
        return format_html('<a href="{}">why it waited (ops)</a>', url)

    @admin.display(description="invocation")
    def invocation_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.invocation, short_id(obj.invocation_id))

    @admin.display(description="workflow")
    def workflow_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.workflow, short_id(obj.workflow_id))

    @admin.display(description="loop")
    def loop_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.loop, short_id(obj.loop_id))

    @admin.display(description="latest run")
    def workflow_run_link(self, obj: WorkflowWorkItem) -> str:
        return admin_link(obj.workflow_run, short_id(obj.workflow_run_id))

    @admin.display(description="all runs")
    def runs_link(self, obj: WorkflowWorkItem) -> str:
        return changelist_link(WorkflowRun, "runs of this item", work_item=obj.pk)


OUTPUT_TAIL_CHARS = 2000


def _tail(text: str | None) -> str:
    """The output's last characters, cleaned as /ops/ cleans it (escape sequences gone,
    any other control character shown as its escape)."""
    if not text:
        return ""
    text = text if len(text) <= OUTPUT_TAIL_CHARS else "…" + text[-OUTPUT_TAIL_CHARS:]
    return terminal_lines(strip_ansi(text))


ACTIVITY_LINES = 12


def _activity(step: WorkflowStepRun) -> str:
    """The agent's output as readable lines (one per event for the JSON-speaking CLIs), the
    last few: what it is doing now while it runs (the runner writes the tails every
    LOOPSWEB_OUTPUT_FLUSH_SECONDS)."""
    lines = summarize_output(step.account_tool, step.stdout or "").splitlines()
    return "\n".join(lines[-ACTIVITY_LINES:])


def item_page_context(
    model_admin: WorkflowWorkItemAdmin, request: HttpRequest, item: WorkflowWorkItem
) -> dict[str, Any]:
    """What the work-item page shows below its fields: runs with their step runs, the
    deferral history, the inbox deliveries, the action history and the action buttons.
    A fixed number of queries, each bounded."""
    now = timezone.now()
    # Runs and their steps' output only for whoever may view both (ledger.webkit.access).
    shown = may_view(request.user, RUNS, STEPS)
    read = work_item_read(item, output=shown)
    runs = read.runs
    steps: dict[str, list[dict[str, Any]]] = {}
    for step in read.every_step() if shown else ():
        attempts = read.attempts[step.id]
        steps.setdefault(step.workflow_run_id, []).append(
            {
                "step": step,
                "attempts": attempts_story(step.step_id, attempts, now),
                "usage": step_usage(step, attempts).text(),
                "duration": seconds(step.duration_ms)
                or (
                    seconds(int((now - step.started_at).total_seconds() * 1000))
                    if step.started_at and step.status == "running"
                    else ""
                ),
                "stdout": _tail(step.stdout),
                "stderr": _tail(step.stderr),
                "activity": _activity(step),
            }
        )
    deferrals = list(item.deferrals.order_by("-created_at", "-id")[:DEFERRALS_SHOWN])
    history = action_history(
        [(WorkflowWorkItem, [item.id]), (WorkflowRun, [r.id for r in runs])]
    )
    operate = model_admin.has_operate_permission(request)
    buttons = []
    if operate:
        for action, statuses in (
            (REQUEUE, services.REQUEUEABLE_STATUSES),
            (RETRY_ITEMS, services.REQUEUEABLE_STATUSES),
            (CANCEL_ITEMS, services.CANCELLABLE_STATUSES),
            (DEAD_LETTER, services.DEAD_LETTERABLE_STATUSES),
        ):
            if item.status in statuses:
                buttons.append(action)
    title = task_title(
        item.invocation.subject_json if item.invocation_id else None, item.subject_ref
    )
    return {
        "title": f"Work item …{item.id[-8:]}: {title}",
        "subtitle": f"{item.route_key} · {item.status} · id {item.id}",
        "item_runs": [
            {
                "run": run,
                "status": status_badge(run.status),
                "duration": seconds(run.duration_ms),
                "steps": [
                    {**row, "status": status_badge(row["step"].status)}
                    for row in steps.get(run.id, [])
                ],
            }
            for run in runs
        ]
        if shown
        else None,
        "item_deferrals": deferrals,
        "item_sections": [
            (section.template, section.read(item)) for section in ITEM_SECTIONS
        ],
        "item_history": history,
        "item_buttons": buttons,
        "item_pk": item.pk,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }


DEFERRALS_SHOWN = 20


@dataclass(frozen=True)
class ItemSection:
    """A block another app adds to the work-item page below the ledger's own: routing adds
    the item's inbox deliveries (routing.admin), so this page never reads routing's
    tables itself. `template` is included with `section` = `read(item)`."""

    template: str
    read: Callable[[WorkflowWorkItem], Any]


ITEM_SECTIONS: list[ItemSection] = []


def add_item_section(section: ItemSection) -> None:
    """Add `section` to every work-item page (once: a second call with the same template
    replaces the first)."""
    ITEM_SECTIONS[:] = [s for s in ITEM_SECTIONS if s.template != section.template]
    ITEM_SECTIONS.append(section)


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
