"""The /ops pages: what waits and why, which account carries what, what each drain did.

Staff only, in the admin's look (the templates extend `admin/base_site.html` and get
`admin.site.each_context`). Every page reads through routing.ops.selectors, so its query
count is fixed whatever the number of rows (tests assert it), and takes `now` once so every
relative age on a page is measured from the same instant.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache

from ledger.admin.base import CappedCountPaginator
from ledger.models import WorkflowWorkItem
from routing.domain import reasons
from routing.drains import configs as drain_configs
from routing.models import DrainRecord, InboxEvent
from routing.ops import accounts as account_selectors
from routing.ops import capacity as ops_capacity
from routing.ops import selectors as sel
from routing.ops.display import (
    LoadBar,
    deferral_snapshot,
    load_chart_svg,
    options_text,
    timeline_svg,
)

View = Callable[..., HttpResponse]
PER_PAGE = 50
DRAIN_RESULTS_SHOWN = 500


def staff_required(view: View) -> View:
    """Anonymous → the admin login (then back here); signed in but not staff → 403."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not (request.user.is_active and request.user.is_staff):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return never_cache(wrapper)


def _render(
    request: HttpRequest, template: str, title: str, section: str, **context: Any
) -> HttpResponse:
    return render(
        request,
        template,
        {
            **admin.site.each_context(request),
            "title": title,
            "section": section,
            # No roots, no agent runs: every page says so, naming the setting.
            "project_roots_unset": not settings.LOOPSWEB_PROJECT_ROOTS,
            **context,
        },
    )


def _page(paginator: Paginator, request: HttpRequest) -> Page:
    return paginator.get_page(request.GET.get("page"))


@staff_required
def overview(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    configs = drain_configs.drain_configs(now=now)
    accounts = account_selectors.account_rows(configs)
    live = sel.live_work()
    return _render(
        request,
        "ops/overview.html",
        "Operations overview",
        "overview",
        now=now,
        scopes=sel.scope_rows(configs, live),
        groups=sel.group_rows(configs, live),
        projects=sel.project_rows(configs, live),
        accounts=accounts,
        cooldowns=[a for a in accounts if a.cooling(now)],
        waiting=account_selectors.waiting_steps(),
        reasons=sel.reason_rows(since=now - timedelta(hours=24), live=live),
        inbox=sel.inbox_depth(),
        drains=list(sel.latest_drains()[:10]),
        capacity=ops_capacity.capacity_view(configs, now=now),
    )


@staff_required
def deferrals(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    filters = {
        "reason_code": request.GET.get("reason_code") or None,
        "route_scope": request.GET.get("route_scope") or None,
        "project_key": request.GET.get("project_key") or None,
    }
    page = _page(CappedCountPaginator(sel.deferred_items(**filters), PER_PAGE), request)
    return _render(
        request,
        "ops/deferrals.html",
        "Deferrals",
        "deferrals",
        now=now,
        groups=sel.deferred_groups(),
        filters={k: v for k, v in filters.items() if v},
        page=page,
        inbox_reasons=sel.deferred_inbox_by_reason(),
        inbox_oldest=sel.oldest_deferred_inbox(),
        reason_codes=[(code, reasons.LABELS[code]) for code in reasons.ALL],
    )


@staff_required
def work_item_deferrals(request: HttpRequest, item_id: str) -> HttpResponse:
    """One item's full deferral history: what each decision saw ("why did it wait?")."""
    now = timezone.now()
    item = get_object_or_404(
        WorkflowWorkItem.objects.select_related("invocation"), pk=item_id
    )
    history = item.deferrals.order_by("created_at", "id")
    page = _page(Paginator(history, 100), request)
    rows = [
        {
            "deferral": d,
            "snapshot": deferral_snapshot(d.counts_json, d.limits_json),
        }
        for d in page.object_list
    ]
    return _render(
        request,
        "ops/work_item.html",
        f"Work item {item.id}",
        "deferrals",
        now=now,
        item=item,
        page=page,
        rows=rows,
        inbox_events=list(
            InboxEvent.objects.filter(work_item_id=item.id)
            .order_by("received_at")
            .defer("data", "metadata")[:20]
        ),
        runs=sel.work_item_runs(item.id),
    )


@staff_required
def accounts(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    schedules = drain_configs.scheduled_drains()
    configs = drain_configs.drain_configs(now=now, schedules=schedules)
    activity = account_selectors.step_activity(now=now)
    rows = account_selectors.account_rows(configs, activity=activity)
    hours = account_selectors.timeline_hours(now)
    starts: dict[tuple[str, datetime], int] = {}
    for stat in activity:
        if stat["hour"] is not None:
            key = (stat["account_profile"], stat["hour"])
            starts[key] = starts.get(key, 0) + stat["n"]
    bars = [
        LoadBar(
            profile=r.profile,
            running=r.running,
            reserved=r.reserved,
            cap=r.cap.limit if r.cap else None,
            cooling=r.cooling(now),
        )
        for r in rows
    ]
    return _render(
        request,
        "ops/accounts.html",
        "Accounts",
        "accounts",
        now=now,
        accounts=rows,
        load_chart=load_chart_svg(bars),
        timeline=timeline_svg([r.profile for r in rows], hours, starts),
        hours=hours,
    )


@staff_required
def drains(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    page = _page(CappedCountPaginator(sel.latest_drains(), PER_PAGE), request)
    return _render(
        request,
        "ops/drains.html",
        "Drains",
        "drains",
        now=now,
        page=page,
        schedules=drain_configs.scheduled_drains(),
    )


@staff_required
def drain_detail(request: HttpRequest, drain_id: str) -> HttpResponse:
    now = timezone.now()
    record = get_object_or_404(DrainRecord, pk=drain_id)
    results = record.results_json if isinstance(record.results_json, list) else []
    shown = [r for r in results[:DRAIN_RESULTS_SHOWN] if isinstance(r, dict)]
    statuses = sel.work_item_statuses(str(r.get("workItemId") or "") for r in shown)
    return _render(
        request,
        "ops/drain.html",
        f"Drain {record.id}",
        "drains",
        now=now,
        record=record,
        drain_list=[record],
        results=[
            {**r, "currentStatus": statuses.get(str(r.get("workItemId") or ""))}
            for r in shown
        ],
        hidden_results=max(0, len(results) - len(shown)),
        options=options_text(
            record.options_json if isinstance(record.options_json, dict) else {}
        ),
    )
