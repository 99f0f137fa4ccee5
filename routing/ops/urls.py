"""The /ops/ operator pages (staff only; see routing.ops.views)."""

from __future__ import annotations

from django.urls import URLPattern, path

from routing.ops import account_actions, run_work, worklists
from routing.ops import views as ops_views

app_name = "ops"
urlpatterns: list[URLPattern] = [
    path("", ops_views.overview, name="overview"),
    path("deferrals/", ops_views.deferrals, name="deferrals"),
    path("attention/", worklists.attention, name="attention"),
    path("delivered/", worklists.delivered, name="delivered"),
    path("items/<str:item_id>/", ops_views.work_item, name="work-item"),
    path(
        "items/<str:item_id>/<str:action>/",
        ops_views.item_action,
        name="item-action",
    ),
    # The item page lived under deferrals/ before it showed runs, steps and accounts.
    path(
        "deferrals/<str:item_id>/",
        ops_views.work_item_moved,
        name="work-item-moved",
    ),
    path("runs/<str:run_id>/patch/", run_work.run_patch_all, name="run-patch"),
    path("runs/<str:run_id>/<str:action>/", run_work.run_action, name="run-action"),
    path("accounts/", ops_views.accounts, name="accounts"),
    path(
        "accounts/<str:name>/clear/",
        account_actions.account_clear,
        name="account-clear",
    ),
    path("hosts/", ops_views.hosts, name="hosts"),
    path("drains/", ops_views.drains, name="drains"),
    path("drains/<str:drain_id>/", ops_views.drain_detail, name="drain"),
    path(
        "schedules/<int:schedule_id>/<str:action>/",
        ops_views.schedule_action,
        name="schedule-action",
    ),
    path(
        "inbox/<str:inbox_id>/drain/",
        ops_views.inbox_last_drain,
        name="inbox-last-drain",
    ),
]
