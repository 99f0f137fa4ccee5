"""Routing admins: the event inbox, where an operator finds an event that failed or waits,
retries (reopens) or discards it with a reason, and follows it to its work item and to the
drain that last recorded an outcome on it.

Read-only like the ledger admins (ledger.admin.base.LedgerAdmin); the only writes are the
two actions, each through its service in routing.drains.inbox after the confirmation page
with a reason, each leaving an admin LogEntry naming the user. The mapped GitHub
repositories are configuration, added, edited and deleted here with the check `manage.py
repo` runs (routing.github_intake.github_repo_clean). Layer: a web surface.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from ledger.admin.actions import LifecycleAction, run_lifecycle_action
from ledger.admin.base import LedgerAdmin, admin_link
from ledger.admin.work_items import ItemSection, add_item_section
from ledger.webkit.cells import age, short_id, status_badge
from routing.api.tokens import token_state
from routing.drains.inbox import inbox_discard, inbox_reopen
from routing.github_intake import RepoInvalid, github_repo_clean
from routing.models import ApiToken, GithubRepo, InboxEvent
from routing.ops import selectors as ops_selectors

REOPEN = LifecycleAction(
    name="reopen_events",
    title="Retry (reopen) inbox events",
    done="reopened",
    explanation=(
        "Failed, skipped and deferred events go back to pending; the next drain of their "
        "route routes them again (admission decides anew). A reason is required and is "
        "kept on the event with your user name."
    ),
    apply=lambda pk, reason, actor: inbox_reopen(
        inbox_id=pk, reason=reason or "", actor=actor
    ),
)
DISCARD = LifecycleAction(
    name="discard_events",
    title="Discard inbox events",
    done="discarded",
    explanation=(
        "Pending, deferred and failed events become skipped: no drain routes them again "
        "(a later delivery of the same source and id stays a duplicate). A reason is "
        "required and is kept on the event with your user name."
    ),
    apply=lambda pk, reason, actor: inbox_discard(
        inbox_id=pk, reason=reason or "", actor=actor
    ),
)


@admin.register(InboxEvent)
class InboxEventAdmin(LedgerAdmin):
    list_display = (
        "short_id_cell",
        "source",
        "event_cell",
        "event_type",
        "state_cell",
        "reason_code",
        "route_attempts",
        "received_cell",
        "work_item_cell",
        "last_drain_cell",
    )
    list_display_links = ("short_id_cell", "event_cell")
    list_filter = ("state",)
    # Exact matches only: each is an index (the (source, event_id) key, the primary key).
    search_fields = ("=event_id", "=id", "=source")
    list_select_related = ("work_item",)
    readonly_fields = ("work_item_cell", "last_drain_cell", "envelope_text")
    fields = (
        ("source", "event_id"),
        ("event_type", "subject", "event_time"),
        ("state", "reason_code", "route_attempts"),
        "last_reason",
        ("received_at", "routed_at", "updated_at"),
        ("work_item_cell", "last_drain_cell"),
        "project_hint",
        "envelope_text",
    )
    actions = ("reopen_events", "discard_events")

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> tuple:
        names = [f.name for f in self.model._meta.concrete_fields]
        return (*self.readonly_fields, *names)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if match and (match.url_name or "").endswith("changelist"):
            return queryset.defer("data", "metadata")  # the list never shows payloads
        return queryset

    @admin.action(
        description="Retry (reopen) selected events…", permissions=["operate"]
    )
    def reopen_events(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, REOPEN)

    @admin.action(description="Discard selected events…", permissions=["operate"])
    def discard_events(
        self, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        return run_lifecycle_action(self, request, queryset, DISCARD)

    @admin.display(description="id", ordering="-id")
    def short_id_cell(self, obj: InboxEvent) -> str:
        return short_id(obj.id)

    @admin.display(description="event id")
    def event_cell(self, obj: InboxEvent) -> str:
        text = obj.event_id if len(obj.event_id) <= 32 else obj.event_id[:31] + "…"
        return format_html('<span title="{}">{}</span>', obj.event_id, text)

    @admin.display(description="state", ordering="state")
    def state_cell(self, obj: InboxEvent) -> str:
        return format_html(
            '<span title="{}">{}</span>', obj.last_reason or "", status_badge(obj.state)
        )

    @admin.display(description="received", ordering="-id")
    def received_cell(self, obj: InboxEvent) -> str:
        return format_html(
            '<span title="{}">{}</span>',
            f"{obj.received_at:%Y-%m-%d %H:%M:%S} UTC",
            age(obj.received_at, timezone.now()),
        )

    @admin.display(description="work item")
    def work_item_cell(self, obj: InboxEvent) -> str:
        return (
            admin_link(obj.work_item, short_id(obj.work_item_id))
            if obj.work_item_id
            else "-"
        )

    @admin.display(description="last drain")
    def last_drain_cell(self, obj: InboxEvent) -> str:
        if obj.routed_at is None:
            return "-"
        url = reverse("ops:inbox-last-drain", args=[obj.pk])
        return format_html('<a href="{}">drain</a>', url)

    @admin.display(description="envelope")
    def envelope_text(self, obj: InboxEvent) -> str:
        return format_html(
            "<pre>{}</pre>", json.dumps(obj.envelope(), indent=2, ensure_ascii=False)
        )


@admin.register(ApiToken)
class ApiTokenAdmin(LedgerAdmin):
    """API tokens, read-only: created, expired and revoked with `manage.py api_token` (the
    secret is never stored, so the admin shows the prefix)."""

    list_display = (
        "name",
        "prefix_cell",
        "scopes_cell",
        "state_cell",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix")
    ordering = ("name",)
    fields = (
        "name",
        "prefix",
        "scopes",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    readonly_fields = fields

    @admin.display(description="Prefix")
    def prefix_cell(self, obj: ApiToken) -> str:
        return f"{obj.prefix}…"

    @admin.display(description="Scopes")
    def scopes_cell(self, obj: ApiToken) -> str:
        return ", ".join(obj.scopes or [])

    @admin.display(description="State")
    def state_cell(self, obj: ApiToken) -> str:
        return status_badge(token_state(obj, timezone.now()))


class GithubRepoForm(forms.ModelForm):
    """A mapping, checked as `manage.py repo add` checks it (github_repo_clean)."""

    class Meta:
        model = GithubRepo
        fields = ("full_name", "project_path", "intake_label")
        labels = {"full_name": "Repository (OWNER/NAME)"}
        widgets = {"project_path": forms.TextInput(attrs={"size": 80})}
        help_texts = {
            "project_path": "The repository's checkout, inside LOOPSWEB_PROJECT_ROOTS "
            "(or a host's roots); the project it resolves to is kept.",
            "intake_label": "Issues carrying this label come in as todos tasks.",
        }

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data  # what ModelForm.clean returns (the stubs: maybe None)
        if self.errors:  # a field refused already (too long, blank): its error says why
            return data
        try:
            values = github_repo_clean(
                full_name=data.get("full_name"),
                project_path=data.get("project_path"),
                intake_label=data.get("intake_label"),
                exclude_pk=self.instance.pk if self.instance.pk else None,
            )
        except RepoInvalid as exc:
            raise forms.ValidationError({exc.field: str(exc)}) from None
        data.update(
            full_name=values.full_name,
            project_path=values.project_path,
            intake_label=values.intake_label,
        )
        return data


@admin.register(GithubRepo)
class GithubRepoAdmin(admin.ModelAdmin):
    """The mapped GitHub repositories: configuration, added, edited and removed here or with
    `manage.py repo` (the same check); Django's own history records each change."""

    form = GithubRepoForm
    list_display = ("full_name", "project_path", "intake_label", "updated_at")
    search_fields = ("full_name", "project_path")
    ordering = ("full_name",)
    readonly_fields = ("created_at", "updated_at")


# The work-item page of the ledger's admin lists the item's inbox deliveries: routing adds
# the section (the ledger never reads routing's tables), with the read /ops/ lists.
add_item_section(
    ItemSection(
        template="admin/routing/item_inbox.html",
        read=lambda item: ops_selectors.item_inbox_events(item.id),
    )
)
