"""Admins of runs, step runs, workflow events, loops and loop runs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from domain.errors import ApplicationError
from ledger.admin.actions import (
    ARCHIVE_LOOPS,
    CANCEL_RUNS,
    DELETE_LOOPS,
    PAUSE_LOOPS,
    RESUME_LOOPS,
    RETRY_RUNS,
    STOP_LOOPS,
    run_lifecycle_action,
)
from ledger.admin.base import LedgerAdmin, admin_link, changelist_link
from ledger.admin.filters import (
    AccountProfileFilter,
    AgeFilter,
    EventTypeFilter,
    ProviderFilter,
)
from ledger.display import (
    UsageSum,
    attempts_story,
    commit_text,
    step_usage,
    worktree_text,
)
from ledger.item_read import item_rounds
from ledger.models import (
    TERMINAL_RUN_STATUSES,
    Loop,
    LoopRun,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
)
from ledger.selectors import step_attempts
from ledger.webkit.audit import log_operator_action
from ledger.webkit.cells import seconds, short_id, status_badge
from runs.delivery import deliver_run, delivery_outcome, redeliverable
from runs.delivery_view import delivery_line, pull_request, run_commits, run_patch
from runs.discard import discard_run_work

# The step run page's fields, each once: the run as a link, the duration in s/min (not
# duration_ms).
STEP_RUN_FIELDS: tuple[str, ...] = tuple(
    {"workflow_run": "run_link", "duration_ms": "duration_cell"}.get(f.name, f.name)
    for f in WorkflowStepRun._meta.concrete_fields
)


class StepRunInline(admin.TabularInline):
    model = WorkflowStepRun
    fields = (
        "step_id",
        "sequence",
        "status_cell",
        "account_profile",
        "account_tool",
        "exit_code",
        "started_at",
        "duration_cell",
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

    @admin.display(description="status")
    def status_cell(self, obj: WorkflowStepRun) -> str:
        return status_badge(obj.status)

    @admin.display(description="duration")
    def duration_cell(self, obj: WorkflowStepRun) -> str:
        return seconds(obj.duration_ms)


@admin.register(WorkflowRun)
class WorkflowRunAdmin(LedgerAdmin):
    list_display = (
        "short_id_cell",
        "workflow_name",
        "status_cell",
        "work_item_link",
        "started_at",
        "finished_at",
        "duration_cell",
    )
    list_filter = ("status", AccountProfileFilter, ProviderFilter, AgeFilter)
    search_fields = ("=id", "workflow_name", "=work_item__id", "idempotency_key")
    list_select_related = ("work_item",)
    raw_id_fields = ("workflow", "loop", "loop_run", "invocation", "work_item")
    # Each field once: the links stand for their foreign keys, the duration for
    # duration_ms, the worktree line for the three worktree columns.
    fields = (
        "id",
        "workflow",  # its name is the run's workflow_name
        "status_cell",
        "work_item_link",
        "invocation_link",
        "loop",
        "loop_run",
        "idempotency_key",
        "scheduled_for",
        "started_at",
        "finished_at",
        "duration_cell",
        "error",
        "attempts_cell",
        "usage_cell",
        "claimed_by",
        "lease_expires_at",
        "worktree",
        "work_left",
        "commit_diffstat",
        "delivery_cell",
        "revisions_cell",
        "commits_cell",
        "patch_cell",
        "manifest_path",
        "goal_run_id",
        "events_link",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields
    inlines = [StepRunInline]
    actions = ("retry_runs", "cancel_runs", "discard_work", "deliver_again")
    change_form_template = "admin/ledger/workflowrun/change_form.html"

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        # The run's work item, for the page's Retry / Cancel buttons (ops_tags.item_actions).
        run = WorkflowRun.objects.select_related("work_item").filter(pk=object_id)
        found = run.first()
        context = {
            **(extra_context or {}),
            "run_item": found.work_item if found is not None else None,
        }
        return super().change_view(request, object_id, form_url, context)

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

    @admin.action(
        description="Discard the work of selected runs (branch and worktree)",
        permissions=["operate"],
    )
    def discard_work(self, request: HttpRequest, queryset: QuerySet) -> None:
        for run in queryset:
            try:
                done = discard_run_work(run.id, reason="discarded (admin)")
            except ApplicationError as exc:
                self.message_user(request, f"{run.id}: {exc}", messages.ERROR)
                continue
            log_operator_action(
                request, WorkflowRun, run.id, "Discard the work (admin)", done.reason
            )
            self.message_user(request, f"{run.id}: work discarded", messages.SUCCESS)

    @admin.action(description="Deliver selected runs again", permissions=["operate"])
    def deliver_again(self, request: HttpRequest, queryset: QuerySet) -> None:
        for run in queryset:
            if not redeliverable(run):
                self.message_user(
                    request, f"{run.id}: nothing to deliver again", messages.WARNING
                )
                continue
            delivered, line = delivery_outcome(run.id, deliver_run(run.id))
            self.message_user(
                request, line, messages.SUCCESS if delivered else messages.ERROR
            )

    @admin.display(description="id", ordering="-id")
    def short_id_cell(self, obj: WorkflowRun) -> str:
        return short_id(obj.id)

    @admin.display(description="status", ordering="status")
    def status_cell(self, obj: WorkflowRun) -> str:
        return status_badge(obj.status)

    @admin.display(description="delivery")
    def delivery_cell(self, obj: WorkflowRun) -> str:
        line = delivery_line(obj) or "-"
        pr = pull_request(obj)
        if pr and pr.get("url"):
            return format_html(
                '{} <a class="pr-link" href="{}" rel="noopener noreferrer">#{}</a>',
                line,
                pr["url"],
                pr.get("number"),
            )
        return line

    @admin.display(description="revisions")
    def revisions_cell(self, obj: WorkflowRun) -> str:
        """The item's rounds (docs/revisions.md §6), this run's marked; the findings are
        untrusted text, escaped here as everywhere."""
        rounds = item_rounds(obj.work_item_id) if obj.work_item_id else []
        if not rounds:
            return "-"
        rows = [
            (
                "this run: " if r["runId"] == obj.id else "",
                r["round"] or "-",
                r["trigger"],
                r["state"],
                ", ".join(r["accounts"]) or "-",
                r["tokens"],
                (r["findings"] or "-")[:300],
            )
            for r in rounds
        ]
        return format_html_join(
            "",
            "<div>{}round {} ({}): {}; accounts {}, {} tokens<pre>{}</pre></div>",
            rows,
        )

    @admin.display(description="commits")
    def commits_cell(self, obj: WorkflowRun) -> str:
        rows = [
            (c["sha"][:12], c["stepId"], c["account"] or "-", c["provider"] or "-")
            for c in run_commits(obj, [s for s, _, _ in self._steps(obj)])
        ]
        if not rows:
            return "-"
        return format_html_join(
            "", "<div><code>{}</code> step {} on <code>{}</code> ({})</div>", rows
        )

    @admin.display(description="patch")
    def patch_cell(self, obj: WorkflowRun) -> str:
        patch = run_patch(obj) if obj.status in TERMINAL_RUN_STATUSES else None
        if patch is None:
            return "-"
        if patch.error:
            return patch.error
        more = (
            format_html(
                '<p><a href="{}">show all</a></p>',
                reverse("ops:run-patch", args=[obj.id]),
            )
            if patch.truncated
            else ""
        )
        return format_html('<pre class="patch">{}</pre>{}', patch.text, more)

    @admin.display(description="duration")
    def duration_cell(self, obj: WorkflowRun) -> str:
        return seconds(obj.duration_ms)

    def _steps(self, obj: WorkflowRun) -> list[tuple[WorkflowStepRun, UsageSum, str]]:
        """The run's steps with their usage and attempts line, read once per page (two
        queries: the steps, their attempts)."""
        cached = getattr(obj, "_step_story", None)
        if cached is None:
            steps = list(
                WorkflowStepRun.objects.filter(workflow_run_id=obj.pk)
                .order_by("sequence")
                .defer("stdout", "stderr")
            )
            attempts = step_attempts(s.id for s in steps)
            now = timezone.now()
            cached = [
                (
                    s,
                    step_usage(s, attempts[s.id]),
                    attempts_story(s.step_id, attempts[s.id], now),
                )
                for s in steps
            ]
            obj._step_story = cached  # type: ignore[attr-defined]
        return cached

    @admin.display(description="attempts")
    def attempts_cell(self, obj: WorkflowRun) -> str:
        """Each step's tries in order, one line per step: `worker: cx-a → rate limited
        after 0.6 s → cx-b, succeeded in 1.4 s · 1,234 in / 56 out`."""
        rows = [(story, usage.text()) for _, usage, story in self._steps(obj) if story]
        if not rows:
            return "-"
        return format_html_join("", '<div class="step-attempts">{} · {}</div>', rows)

    @admin.display(description="tokens / cost")
    def usage_cell(self, obj: WorkflowRun) -> str:
        return sum((usage for _, usage, _ in self._steps(obj)), UsageSum()).text()

    @admin.display(description="work item")
    def work_item_link(self, obj: WorkflowRun) -> str:
        return admin_link(obj.work_item, short_id(obj.work_item_id))

    @admin.display(description="invocation")
    def invocation_link(self, obj: WorkflowRun) -> str:
        return admin_link(obj.invocation)

    @admin.display(description="events")
    def events_link(self, obj: WorkflowRun) -> str:
        return changelist_link(WorkflowEvent, "events of this run", workflow_run=obj.pk)

    @admin.display(description="worktree")
    def worktree(self, obj: WorkflowRun) -> str:
        return worktree_text(obj)

    @admin.display(description="work left")
    def work_left(self, obj: WorkflowRun) -> str:
        return commit_text(obj)


@admin.register(WorkflowStepRun)
class WorkflowStepRunAdmin(LedgerAdmin):
    list_display = (
        "short_id_cell",
        "step_id",
        "status_cell",
        "account_profile",
        "account_tool",
        "exit_code",
        "duration_cell",
        "started_at",
        "run_link",
    )
    list_filter = ("status", ProviderFilter, AccountProfileFilter, AgeFilter)
    search_fields = ("=id", "step_id", "=workflow_run__id", "account_profile")
    list_select_related = ("workflow_run",)
    raw_id_fields = ("workflow_run",)
    fields = STEP_RUN_FIELDS
    readonly_fields = fields

    @admin.display(description="id", ordering="-id")
    def short_id_cell(self, obj: WorkflowStepRun) -> str:
        return short_id(obj.id)

    @admin.display(description="status", ordering="status")
    def status_cell(self, obj: WorkflowStepRun) -> str:
        return status_badge(obj.status)

    @admin.display(description="duration")
    def duration_cell(self, obj: WorkflowStepRun) -> str:
        return seconds(obj.duration_ms)

    @admin.display(description="workflow run")
    def run_link(self, obj: WorkflowStepRun) -> str:
        return admin_link(obj.workflow_run, short_id(obj.workflow_run_id))


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
        "retry_delay_ms",
        "archived_at",
        "updated_at",
    )
    list_filter = ("status",)
    search_fields = ("=id", "name")
    readonly_fields = ("id",)
    actions = (
        "pause_loops",
        "resume_loops",
        "archive_loops",
        "stop_loops",
        "delete_loops",
    )

    @admin.action(description="Pause selected loops…", permissions=["operate"])
    def pause_loops(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, PAUSE_LOOPS)

    @admin.action(description="Resume selected loops…", permissions=["operate"])
    def resume_loops(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, RESUME_LOOPS)

    @admin.action(description="Archive selected loops…", permissions=["operate"])
    def archive_loops(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, ARCHIVE_LOOPS)

    @admin.action(description="Stop selected loops…", permissions=["operate"])
    def stop_loops(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, STOP_LOOPS)

    @admin.action(
        description="Delete selected loops (cancels their items)…",
        permissions=["operate"],
    )
    def delete_loops(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, DELETE_LOOPS)


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
