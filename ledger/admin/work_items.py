"""Ledger admins: the operator console over the record.

The record is history, so nothing is added, edited or deleted here; the only writes are the
lifecycle actions (requeue, cancel, dead-letter, retry), each of which calls its service in
ledger.services after a confirmation page that shows how many rows it will touch.

Large tables (a million work items, millions of step runs) stay fast:
- no full-table COUNT: `show_full_result_count = False` and a paginator whose count stops at
  COUNT_CAP;
- newest first by primary key (ids start with their creation time, see ledger.ids), which is
  an index walk where `ORDER BY created_at` would sort the whole table;
- filters whose choices cost an index probe per value (a loose index scan), a fixed list, or
  a small live set, never `SELECT DISTINCT` over history; the age filter is a key range;
- `list_select_related` for every relation shown, raw id widgets for every relation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.paginator import Paginator
from django.db.models import Exists, Model, OuterRef, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from ledger import services
from ledger.models import (
    AccountCooldown,
    Loop,
    LoopRun,
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from routing.domain import reasons
from routing.domain.errors import ApplicationError
from routing.domain.templates import (
    EVENT_WORKER_VERIFIER,
    TASK_LIFECYCLE,
    TODOS_TASK_WORKER_VERIFIER,
)
from routing.ops_selectors import created_before, created_since, distinct_values
from routing.services import PROVIDERS

COUNT_CAP = 10_000
# One action request runs one short transaction per row; bound the batch so a request
# finishes well inside a proxy timeout. Larger clean-ups belong in a command.
MAX_ACTION_ROWS = 500


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
    # Ledger ids sort by creation time: newest first without sorting the table.
    ordering = ("-id",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Who may run lifecycle actions: users holding the model's change permission.

        The admin never edits rows (has_change_permission is False for everyone), so the
        Django permission is free to mean "may operate": superusers, and staff granted it.
        """
        opts = self.model._meta
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")


def admin_link(obj: Any, label: str | None = None) -> str:
    """A link to obj's admin change page ('-' when obj is None)."""
    if obj is None:
        return "-"
    url = reverse(
        f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk]
    )
    return format_html('<a href="{}">{}</a>', url, label or str(obj))


def changelist_link(model: type[Model], label: str, **params: str) -> str:
    """A link to a changelist filtered by `params` (one-part lookups the admin allows)."""
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    return format_html('<a href="{}?{}">{}</a>', url, urlencode(params), label)


# --- filters ----------------------------------------------------------------------------------


class ChoicesFilter(admin.SimpleListFilter):
    """A SimpleListFilter that keeps a value given in the URL even when it is not offered.

    Django drops a SimpleListFilter with no choices and, with it, the value it was given;
    a link from an ops page may name a value the short choice list does not hold.
    """

    def values(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        choices = self.values(request, model_admin)
        value = self.value()
        if value and value not in {key for key, _ in choices}:
            choices.append((value, value))
        return choices


class DistinctValueFilter(ChoicesFilter):
    """Exact match on an indexed column; choices by a loose index scan (see distinct_values)."""

    field_name = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.parameter_name = cls.parameter_name or cls.field_name

    def values(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(v, v) for v in distinct_values(model_admin.model, self.field_name)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(**{self.field_name: value}) if value else queryset


class RouteKeyFilter(DistinctValueFilter):
    title = "route key"
    field_name = "route_key"


class RouteScopeFilter(DistinctValueFilter):
    title = "route scope"
    field_name = "route_scope"


class ProjectFilter(DistinctValueFilter):
    title = "project"
    field_name = "project_key"


class ProjectGroupFilter(DistinctValueFilter):
    title = "project group"
    field_name = "project_group"


class SourceKindFilter(DistinctValueFilter):
    title = "source kind"
    field_name = "source_kind"


class SubjectKindFilter(DistinctValueFilter):
    title = "subject kind"
    field_name = "subject_kind"


class ReasonCodeFilter(ChoicesFilter):
    title = "reason code"
    parameter_name = "reason_code"

    def values(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(code, reasons.LABELS[code]) for code in reasons.ALL]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(reason_code=value) if value else queryset


class TemplateFilter(ChoicesFilter):
    title = "template"
    parameter_name = "template_id"

    def values(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (t, t)
            for t in (TODOS_TASK_WORKER_VERIFIER, TASK_LIFECYCLE, EVENT_WORKER_VERIFIER)
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(template_id=value) if value else queryset


def _with_steps(queryset: QuerySet, **step_filter: Any) -> QuerySet:
    """Rows that have a step run matching `step_filter` (work items through their runs)."""
    if queryset.model is WorkflowStepRun:
        return queryset.filter(**step_filter)
    steps = WorkflowStepRun.objects.filter(**step_filter)
    if queryset.model is WorkflowRun:
        return queryset.filter(Exists(steps.filter(workflow_run_id=OuterRef("pk"))))
    return queryset.filter(
        Exists(steps.filter(workflow_run__work_item_id=OuterRef("pk")))
    )


class AccountProfileFilter(ChoicesFilter):
    """Rows whose (runs') steps ran on the chosen account profile."""

    title = "account profile"
    parameter_name = "account_profile"

    def values(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Choices from small live sets (cooldowns, live steps, the last day's steps), never
        # a DISTINCT over every step run ever (workflow_step_runs has no account index).
        recent = created_since(
            WorkflowStepRun.objects.all(), timezone.now() - timedelta(days=1)
        ).filter(account_profile__isnull=False)
        live = WorkflowStepRun.objects.filter(
            status__in=(StepStatus.PENDING, StepStatus.RUNNING),
            account_profile__isnull=False,
        )
        profiles = set(
            AccountCooldown.objects.values_list("account_profile", flat=True)
        )
        profiles.update(recent.values_list("account_profile", flat=True).distinct())
        profiles.update(live.values_list("account_profile", flat=True).distinct())
        return [(p, p) for p in sorted(profiles)[:100]]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return _with_steps(queryset, account_profile=value) if value else queryset


class ProviderFilter(ChoicesFilter):
    """Rows whose (runs') steps ran with the chosen provider tool (account_tool)."""

    title = "provider"
    parameter_name = "provider"

    def values(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(p, p) for p in PROVIDERS]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return _with_steps(queryset, account_tool=value) if value else queryset


class AgeFilter(admin.SimpleListFilter):
    """Age by creation time, as a primary-key range (ledger ids start with their time)."""

    title = "age"
    parameter_name = "age"
    WINDOWS = {
        "1h": timedelta(hours=1),
        "24h": timedelta(hours=24),
        "7d": timedelta(days=7),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("1h", "< 1 hour"),
            ("24h", "< 24 hours"),
            ("7d", "< 7 days"),
            ("older", "older than 7 days"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value, now = self.value(), timezone.now()
        if value in self.WINDOWS:
            return created_since(queryset, now - self.WINDOWS[value])
        if value == "older":
            return created_before(queryset, now - self.WINDOWS["7d"])
        return queryset


class EventTypeFilter(ChoicesFilter):
    title = "event type"
    parameter_name = "event_type"

    def values(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        steps = [f"step_{s}" for s in StepStatus.values if s != StepStatus.PENDING]
        runs = [s for s in RunStatus.values if s not in (RunStatus.QUEUED,)]
        types = ["created", "claimed", "step_waiting", *steps, *runs]
        return [(t, t) for t in [*types, "workflow_archived"]]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(event_type=value) if value else queryset


# --- lifecycle actions ------------------------------------------------------------------------


class ActionReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
    )

    def __init__(self, *args: Any, required: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["reason"].required = required


@dataclass(frozen=True)
class LifecycleAction:
    """One confirmed admin action: what it is called and the service it runs per row."""

    name: str  # the admin action's name (the POSTed `action`)
    title: str
    done: str  # past tense for the message: "requeued"
    explanation: str
    apply: Callable[[str, str | None], object]
    reason_required: bool = True
    default_reason: str = ""


def run_lifecycle_action(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    action: LifecycleAction,
) -> TemplateResponse | None:
    """First POST: a confirmation page with the count and a reason field. Confirmed POST:
    call the service once per row, then `message_user` with how many changed and why the
    others did not (each service refuses rows whose status does not allow the change)."""
    opts = model_admin.model._meta
    ids = list(
        queryset.order_by("pk").values_list("pk", flat=True)[: MAX_ACTION_ROWS + 1]
    )
    if len(ids) > MAX_ACTION_ROWS:
        model_admin.message_user(
            request,
            f"Select at most {MAX_ACTION_ROWS} {opts.verbose_name_plural} per action "
            f"(narrow the list with the filters).",
            messages.ERROR,
        )
        return None
    if request.POST.get("confirm") == "yes":
        form = ActionReasonForm(request.POST, required=action.reason_required)
        if form.is_valid():
            reason = form.cleaned_data["reason"].strip() or None
            done, refused = 0, []
            for pk in ids:
                try:
                    action.apply(pk, reason)
                    done += 1
                except ApplicationError as exc:
                    refused.append(str(exc))
            noun = opts.verbose_name if done == 1 else opts.verbose_name_plural
            model_admin.message_user(
                request,
                f"{action.done.capitalize()} {done} {noun}.",
                messages.SUCCESS if done else messages.WARNING,
            )
            if refused:
                more = f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
                model_admin.message_user(
                    request,
                    f"{len(refused)} not {action.done}: {'; '.join(refused[:5])}{more}",
                    messages.WARNING,
                )
            return None
    else:
        form = ActionReasonForm(
            initial={"reason": action.default_reason}, required=action.reason_required
        )
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(
        request,
        "admin/ledger/confirm_action.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": action.title,
            "subtitle": None,
            "opts": opts,
            "action": action,
            "ids": ids,
            "count": len(ids),
            "noun": opts.verbose_name if len(ids) == 1 else opts.verbose_name_plural,
            "preview": list(
                model_admin.model.objects.filter(pk__in=ids[:20]).order_by("-pk")
            ),
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": model_admin.media,
        },
    )


REQUEUE = LifecycleAction(
    name="requeue_items",
    title="Requeue work items",
    done="requeued",
    explanation=(
        "Upstream `routes requeue`: only succeeded, failed, dead-letter and cancelled items "
        "go back to queued (bindings cleared, attempts kept); their inbox events reopen so "
        "the next drain admits them again. A reason is required."
    ),
    apply=lambda pk, reason: services.work_item_requeue(
        item_id=pk, reason=reason or ""
    ),
)
CANCEL_ITEMS = LifecycleAction(
    name="cancel_items",
    title="Cancel work items",
    done="cancelled",
    explanation=(
        "Queued, deferred, admitted and running items become cancelled; a run still in "
        "progress is cancelled with its item (its process is stopped)."
    ),
    apply=lambda pk, reason: services.work_item_cancel(item_id=pk, reason=reason or ""),
    default_reason=services.CANCEL_REASON_DEFAULT,
)
DEAD_LETTER = LifecycleAction(
    name="dead_letter_items",
    title="Dead-letter work items",
    done="dead-lettered",
    explanation=(
        "Parks items as dead_letter until someone requeues them; later deliveries of their "
        "events dedupe. Admitted or running items must be cancelled first."
    ),
    apply=lambda pk, reason: services.work_item_dead_letter(
        item_id=pk, reason=reason or ""
    ),
    default_reason="dead-lettered by operator",
)
RETRY_RUNS = LifecycleAction(
    name="retry_runs",
    title="Retry workflow runs",
    done="retried",
    explanation=(
        "The work item of each failed, timed-out or cancelled run (its latest run) is "
        "requeued; the next drain admits it as a new run. The reason is optional."
    ),
    apply=lambda pk, reason: services.run_retry(run_id=pk, reason=reason),
    reason_required=False,
)
CANCEL_RUNS = LifecycleAction(
    name="cancel_runs",
    title="Cancel workflow runs",
    done="cancelled",
    explanation=(
        "Queued and running runs are cancelled with their open steps and work item; a "
        "running step's process is stopped."
    ),
    apply=lambda pk, reason: services.run_cancel(
        run_id=pk, reason=reason or services.CANCEL_REASON_DEFAULT
    ),
    default_reason=services.CANCEL_REASON_DEFAULT,
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


class StepRunInline(admin.TabularInline):
    model = WorkflowStepRun
    fields = (
        "step_id",
        "sequence",
        "status",
        "account_profile",
        "account_tool",
        "exit_code",
        "started_at",
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
        "work_item_link",
        "started_at",
        "finished_at",
        "duration_ms",
    )
    list_filter = ("status", AccountProfileFilter, ProviderFilter, AgeFilter)
    search_fields = ("=id", "workflow_name", "=work_item__id", "idempotency_key")
    list_select_related = ("work_item",)
    raw_id_fields = ("workflow", "loop", "loop_run", "invocation", "work_item")
    readonly_fields = ("id", "work_item_link", "invocation_link", "events_link")
    inlines = [StepRunInline]
    actions = ("retry_runs", "cancel_runs")

    @admin.action(description="Retry selected failed runs…", permissions=["operate"])
    def retry_runs(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, RETRY_RUNS)

    @admin.action(description="Cancel selected runs…", permissions=["operate"])
    def cancel_runs(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, CANCEL_RUNS)

    @admin.display(description="work item")
    def work_item_link(self, obj: WorkflowRun) -> str:
        return admin_link(obj.work_item, obj.work_item_id)

    @admin.display(description="invocation")
    def invocation_link(self, obj: WorkflowRun) -> str:
        return admin_link(obj.invocation)

    @admin.display(description="events")
    def events_link(self, obj: WorkflowRun) -> str:
        return changelist_link(WorkflowEvent, "events of this run", workflow_run=obj.pk)


@admin.register(WorkflowStepRun)
class WorkflowStepRunAdmin(LedgerAdmin):
    list_display = (
        "id",
        "step_id",
        "status",
        "account_profile",
        "account_tool",
        "run_link",
        "exit_code",
        "duration_ms",
        "started_at",
    )
    list_filter = ("status", ProviderFilter, AccountProfileFilter, AgeFilter)
    search_fields = ("=id", "step_id", "=workflow_run__id", "account_profile")
    list_select_related = ("workflow_run",)
    raw_id_fields = ("workflow_run",)
    readonly_fields = ("id", "run_link")

    @admin.display(description="workflow run")
    def run_link(self, obj: WorkflowStepRun) -> str:
        return admin_link(obj.workflow_run)


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
    list_filter = (EventTypeFilter, AgeFilter)
    search_fields = ("=id", "=workflow_run__id")
    list_select_related = ("workflow_run",)
    raw_id_fields = ("workflow_run",)


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
