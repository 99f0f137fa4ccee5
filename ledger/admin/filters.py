"""List filters whose choices cost an index probe per value, a fixed list or a small live
set, never `SELECT DISTINCT` over history; the age filter is a key range.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from agents.providers import PROVIDERS
from domain import reasons
from domain.templates import (
    EVENT_WORKER_VERIFIER,
    TASK_LIFECYCLE,
    TODOS_TASK_WORKER_VERIFIER,
)
from ledger.models import (
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
)
from ledger.selectors import created_before, created_since, distinct_values

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
        for steps in (recent, live):  # both exclude NULL profiles
            profiles.update(
                p
                for p in steps.values_list("account_profile", flat=True).distinct()
                if p is not None
            )
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
