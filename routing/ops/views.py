"""The /ops pages: what waits and why, which account carries what, what each drain did.

For staff holding the view permissions of what each page shows (`ops_view`, with
ledger.webkit.access's rule), in the admin's look (the templates extend
`admin/base_site.html` and get `admin.site.each_context`). Every page reads through routing.ops.selectors and, for what
it shows as the API and /metrics do, routing.selectors, so its query count is fixed
whatever the number of rows (tests assert it), and takes `now` once so every relative age
on a page is measured from the same instant.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from django_q.models import Schedule

from domain import reasons
from domain.errors import ApplicationError
from ledger import services
from ledger.capacity import hosts_view
from ledger.item_read import item_rounds, work_item_read
from ledger.lock import SLOW_WAIT_SECONDS, lock_state
from ledger.models import WorkflowWorkItem
from ledger.services.notifications import notifications_undelivered
from ledger.webkit import access
from ledger.webkit.audit import log_operator_action
from ledger.webkit.cells import task_description, task_title
from ledger.webkit.paging import CappedCountPaginator
from routing import selectors as shared
from routing.admission import retry_outcome, retry_work_item
from routing.drains import configs as drain_configs
from routing.drains.retention import DID_SOMETHING, EMPTY, HAS_ERROR, HELD
from routing.models import DrainRecord, InboxEvent
from routing.ops import capacity_warnings
from routing.ops import item as ops_item
from routing.ops import selectors as sel
from routing.ops.account_groups import accounts_page, overview_accounts
from routing.ops.display import (
    DRAINS_READ,
    LoadBar,
    collapsed_drains,
    deferral_snapshot,
    load_chart_svg,
    options_text,
    throughput_svg,
    timeline_hours,
    timeline_svg,
)
from routing.templatetags.ops_tags import ITEM_ACTION_PERMISSION

View = Callable[..., HttpResponse]
PER_PAGE = 50
DRAIN_RESULTS_SHOWN = 500
# The ops pages reload themselves this often unless the operator pauses it (base.html).
REFRESH_SECONDS = 30
DRAIN_FILTERS = {
    "did": ("did something", DID_SOMETHING),
    "error": ("with an error", HAS_ERROR),
    "held": ("held", HELD),
    "empty": ("did nothing", EMPTY),
}


# Each /ops/ view (as decorated) → the permissions it needs (ops_view).
PERMISSIONS: dict[View, tuple[str, ...]] = {}


def ops_view(*perms: str) -> Callable[[View], View]:
    """Anonymous → the admin login (then back here); signed in but not active staff holding
    the work items' view permission and each of `perms` → 403, whatever the method, before
    the view reads anything (ledger.webkit.access; docs/operations.md, "Who sees what").
    What each view needs is kept in PERMISSIONS (the nav reads it)."""
    needed = (access.ITEMS, *perms)

    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(
                    request.get_full_path(), reverse("admin:login")
                )
            if not access.may_view(request.user, *needed):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        guarded = never_cache(wrapper)
        PERMISSIONS[guarded] = needed
        return guarded

    return decorator


# Every /ops/ page and action: active staff with the work items' view permission.
staff_required = ops_view()


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
            "refresh_seconds": REFRESH_SECONDS,
            # No roots, no agent runs: every page says so, naming the setting.
            "project_roots_unset": not settings.LOOPSWEB_PROJECT_ROOTS,
            # What this user may see: the nav's links, the pages' sections.
            "ops_may": access.visible(request.user),
            "ops_pages": {
                name: access.may_view(request.user, *PERMISSIONS[view])
                for name, view in NAV.items()
            },
            **context,
        },
    )


# The other /ops/ page modules render with the same context (routing.ops.worklists).
render_page = _render


def _page(paginator: Paginator, request: HttpRequest) -> Page:
    return paginator.get_page(request.GET.get("page"))


def hint_kind(drains: list[DrainRecord], schedules: list[Any]) -> str:
    """The route kind the page's hints name: the latest drain's, else a schedule's, else
    `generic` (a todos-task installation should not read `drain generic`)."""
    for record in drains:
        if record.kind:
            return "todos-task" if record.kind == "todos-task" else "generic"
    for schedule in schedules:
        if schedule.kind:
            return str(schedule.kind)
    return "generic"


@staff_required
def overview(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    schedules = drain_configs.scheduled_drains()
    configs = drain_configs.drain_configs(now=now, schedules=schedules)
    # A section of other records only for whoever may view them (ledger.webkit.access).
    may = access.visible(request.user)
    accounts = shared.account_rows(configs) if may["accounts"] else []
    live = shared.live_work()
    drains = list(sel.latest_drains()[:DRAINS_READ])  # also the hints' route kind
    reasons_now = sel.reason_rows(since=now - timedelta(hours=24), live=live)
    inbox = shared.inbox_by_state()
    waiting = sel.waiting_steps()  # also the "nothing waits" copy
    hours = timeline_hours(now)
    deferred_items = sum(r.deferred for r in reasons_now)
    overdue = sel.overdue_schedules(now=now)  # the section's and the capacity warning's
    kind = hint_kind(drains, schedules)
    unscheduled = capacity_warnings.unscheduled_warning(
        pending=inbox["pending"]["n"],
        deferred=inbox["deferred"]["n"],
        schedules=schedules,
        kind=kind if (drains or schedules) else None,
    )
    return _render(
        request,
        "ops/overview.html",
        "Operations overview",
        "overview",
        now=now,
        # A drain's cap is red only when what it admitted fills it (ScopeCapRow).
        scopes=sel.scope_cap_rows(shared.scope_rows(configs, live), live),
        groups=sel.group_rows(configs, live),
        projects=sel.project_rows(configs, live),
        accounts=accounts,
        cooldowns=[a for a in accounts if a.cooling(now)],
        # The free accounts on one line (routing.ops.account_groups).
        account_load=overview_accounts(accounts, now),
        reasons=reasons_now,
        inbox=inbox,
        # Runs of drains that did nothing folded into one row each.
        drains=collapsed_drains(drains) if may["drains"] else [],
        running=sel.running_steps() if may["steps"] else [],
        waiting=waiting if may["steps"] else [],
        overdue=overdue,
        throughput=throughput_svg(
            hours,
            sel.run_throughput(now=now),
            # The failed ones of the chart's 24 hours, with their reasons.
            failed_href=f"{reverse('ops:attention')}?since=24h"
            if may["runs"] and may["steps"]
            else "",
        ),
        kind=kind,
        # The copy beside the numbers: "nothing is waiting" only when nothing is.
        deferred_items=deferred_items,
        nothing_waits=not (
            deferred_items or waiting or inbox["deferred"]["n"] or inbox["pending"]["n"]
        ),
        capacity=capacity_warnings.capacity_view(
            configs, now=now, overdue=overdue, unscheduled=unscheduled
        ),
        # Deliveries that failed (docs/operations.md "Notifications"): one query.
        notifications=notifications_undelivered(),
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
    inbox_reasons = sel.deferred_inbox_by_reason()
    inbox_deferred = sum(r["n"] for r in inbox_reasons)
    schedules = drain_configs.scheduled_drains()
    kind = hint_kind(list(sel.latest_drains()[:1]), schedules)
    return _render(
        request,
        "ops/deferrals.html",
        "Deferrals",
        "deferrals",
        now=now,
        groups=sel.deferred_groups(),
        filters={k: v for k, v in filters.items() if v},
        page=page,
        inbox_reasons=inbox_reasons,
        inbox_deferred=inbox_deferred,
        inbox_oldest=sel.oldest_deferred_inbox(),
        # Held events wait for a drain: say so when no schedule will run one.
        unscheduled=capacity_warnings.unscheduled_warning(
            pending=0, deferred=inbox_deferred, schedules=schedules, kind=kind
        ),
        kind=kind,
        reason_codes=[(code, reasons.LABELS[code]) for code in reasons.ALL],
    )


@staff_required
def work_item_moved(request: HttpRequest, item_id: str) -> HttpResponse:
    """The item page's old address (under /ops/deferrals/): a permanent redirect."""
    url = reverse("ops:work-item", args=[item_id])
    query = request.META.get("QUERY_STRING")
    return HttpResponsePermanentRedirect(f"{url}?{query}" if query else url)


@staff_required
def work_item(request: HttpRequest, item_id: str) -> HttpResponse:
    """One work item: its task (title, description), where it stands, its runs with their
    steps (each attempt and the account it ran on, tokens and cost, the error, the live
    output of a running step; routing.ops.item), its full deferral history (what each
    decision saw: "why did it wait?") and the inbox events that produced it."""
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
    # Runs (their patches) and steps (their output) only for whoever may view both.
    shown = access.may_view(request.user, access.RUNS, access.STEPS)
    read = work_item_read(item)
    run_rows, item_usage = ops_item.run_views(read, now=now) if shown else ([], None)
    subject = item.invocation.subject_json if item.invocation_id else None
    accounts: dict[str, dict[str, Any]] = {}
    for step in read.every_step() if shown else ():
        if step.account_profile:
            entry = accounts.setdefault(
                step.account_profile,
                {"profile": step.account_profile, "tool": None, "steps": []},
            )
            entry["tool"] = entry["tool"] or step.account_tool
            entry["steps"].append(step.step_id)
    return _render(
        request,
        "ops/work_item.html",
        f"Work item {item.id}",
        "item",
        now=now,
        item=item,
        page=page,
        rows=rows,
        task_title=task_title(subject, item.subject_ref),
        task_description=task_description(subject),
        inbox_events=[
            (event, ops_item.inbox_state(event.state, item.status))
            for event in sel.item_inbox_events(item.id)
        ],
        runs=run_rows,
        rounds=item_rounds(item.id) if shown else [],
        item_usage=item_usage,
        accounts=sorted(accounts.values(), key=lambda a: a["profile"]),
    )


ITEM_ACTIONS = ("retry", "cancel")


@staff_required
@require_POST
def item_action(request: HttpRequest, item_id: str, action: str) -> HttpResponse:
    """Retry (re-admit now with the route the item stores: `routing.admission.retry_work_item`) or
    cancel (`services.work_item_cancel`) one work item, from the /ops/ item page or the
    admin's run page. Needs the item's change permission (403 without); CSRF as every POST.
    Audited twice: an admin LogEntry naming the user, and the run's `operator_<action>`
    event. A refusal (the status does not allow it, the stored route no longer routes)
    changes nothing and says why. Back to `next` when it is this site's, else the item."""
    if action not in ITEM_ACTIONS:
        raise Http404
    if not request.user.has_perm(ITEM_ACTION_PERMISSION):
        raise PermissionDenied
    get_object_or_404(WorkflowWorkItem.objects.only("id"), pk=item_id)
    reason = (request.POST.get("reason") or "").strip()[:2000] or None
    actor = request.user.get_username()
    try:
        if action == "retry":
            item = retry_work_item(item_id=item_id, reason=reason, actor=actor)
            text = retry_outcome(item)
        else:
            item = services.work_item_cancel(
                item_id=item_id,
                reason=reason or services.CANCEL_REASON_DEFAULT,
                actor=actor,
            )
            text = f"cancelled {item.id}: {item.last_reason}"
    except ApplicationError as exc:
        messages.error(request, f"{action} refused: {exc}")
    else:
        title = "Retry work item" if action == "retry" else "Cancel work item"
        log_operator_action(
            request, WorkflowWorkItem, item_id, f"{title} (ops)", reason or text
        )
        messages.success(request, text[0].upper() + text[1:] + ".")
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = reverse("ops:work-item", args=[item_id])
    return HttpResponseRedirect(target)


@ops_view(access.HOSTS)
def hosts(request: HttpRequest) -> HttpResponse:
    """The machines that run agents (ledger.hosts), and the runs no live host serves."""
    now = timezone.now()
    return _render(
        request,
        "ops/hosts.html",
        "Hosts",
        "hosts",
        now=now,
        view=hosts_view(now=now),
        lock=lock_state(),
        slow_wait=SLOW_WAIT_SECONDS,
        dead_seconds=settings.LOOPSWEB_HOST_DEAD_SECONDS,
        grace_seconds=settings.LOOPSWEB_NO_HOST_GRACE_SECONDS,
    )


@ops_view(access.ACCOUNTS)
def accounts(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    schedules = drain_configs.scheduled_drains()
    configs = drain_configs.drain_configs(now=now, schedules=schedules)
    activity = shared.step_activity(now=now)
    # The query string's filter by provider and state (routing.ops.account_groups).
    page = accounts_page(
        shared.account_rows(configs, activity=activity), request.GET, now
    )
    rows = page["accounts"]
    hours = timeline_hours(now)
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
        **page,
        load_chart=load_chart_svg(bars),
        timeline=timeline_svg([r.profile for r in rows], hours, starts),
        hours=hours,
    )


@ops_view(access.DRAINS, access.SCHEDULES)
def drains(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    show = request.GET.get("show") or ""
    records = sel.latest_drains()
    if show in DRAIN_FILTERS:
        records = records.filter(DRAIN_FILTERS[show][1])
    page = _page(CappedCountPaginator(records, PER_PAGE), request)
    schedules = drain_configs.scheduled_drains()
    return _render(
        request,
        "ops/drains.html",
        "Drains",
        "drains",
        now=now,
        page=page,
        show=show if show in DRAIN_FILTERS else "",
        drain_filters=[(key, label) for key, (label, _) in DRAIN_FILTERS.items()],
        schedules=schedules,
        kind=hint_kind(list(page.object_list), schedules),
        other_schedules=[
            {**row, "paused": row["repeats"] == 0}
            for row in Schedule.objects.exclude(func=drain_configs.DRAIN_FUNC)
            .order_by("name")
            .values("id", "name", "func", "next_run", "repeats")
        ],
        can_operate=request.user.has_perm("django_q.change_schedule"),
        retention_days=settings.LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS,
    )


SCHEDULE_ACTIONS = ("pause", "resume", "run")


@ops_view(access.SCHEDULES)
@require_POST
def schedule_action(
    request: HttpRequest, schedule_id: int, action: str
) -> HttpResponse:
    """Pause (repeats 0: django-q2's scheduler skips it), resume (repeats -1, due now if it
    was overdue) or run now (due now: the next scheduler tick, within about 30 s, runs it
    once, with its overlap skip) one schedule. Needs django_q's change_schedule permission;
    leaves an admin LogEntry naming the user."""
    if action not in SCHEDULE_ACTIONS:
        raise Http404
    if not request.user.has_perm("django_q.change_schedule"):
        raise PermissionDenied
    schedule = get_object_or_404(Schedule, pk=schedule_id)
    now = timezone.now()
    if action == "pause":
        schedule.repeats = 0
        text = f"Paused schedule {schedule.name}."
    elif action == "resume":
        schedule.repeats = -1
        if schedule.next_run is None or schedule.next_run < now:
            schedule.next_run = now
        text = f"Resumed schedule {schedule.name}."
    else:
        if schedule.repeats == 0:
            messages.error(
                request, f"Schedule {schedule.name} is paused: resume it to run it."
            )
            return HttpResponseRedirect(reverse("ops:drains"))
        schedule.next_run = now
        text = (
            f"Schedule {schedule.name} is due now: a running qcluster starts it at its "
            "next scheduler tick."
        )
    schedule.save(update_fields=["repeats", "next_run"])
    assert request.user.pk is not None  # staff_required: a signed-in user
    LogEntry.objects.log_actions(
        user_id=request.user.pk,
        queryset=[schedule],
        action_flag=CHANGE,
        change_message=f"{action} (ops drains page)",
        single_object=True,
    )
    messages.success(request, text)
    return HttpResponseRedirect(reverse("ops:drains") + "#schedules")


@ops_view(access.DRAINS)
def inbox_last_drain(request: HttpRequest, inbox_id: str) -> HttpResponse:
    """From an inbox event (admin) to the drain that last recorded an outcome on it."""
    row = get_object_or_404(InboxEvent.objects.defer("data", "metadata"), pk=inbox_id)
    record = sel.drain_of_inbox_event(row)
    if record is None:
        messages.warning(
            request,
            "No drain record names this event: it was routed by the API (route=now), "
            "or its drain record was pruned.",
        )
        return HttpResponseRedirect(
            reverse("admin:routing_inboxevent_change", args=[row.pk])
        )
    return HttpResponseRedirect(reverse("ops:drain", args=[record.pk]))


@ops_view(access.DRAINS)
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


# The nav's pages a user may lack (templates/ops/base.html): shown when their view lets in.
NAV: dict[str, View] = {"accounts": accounts, "hosts": hosts, "drains": drains}
