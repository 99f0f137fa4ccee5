from __future__ import annotations

from django.urls import URLPattern, path

from routing.api import views as api_views
from routing.api import worklists as api_worklists

app_name = "api"
urlpatterns: list[URLPattern] = [
    path("events", api_views.events, name="events"),
    path("work-items", api_views.work_item_list, name="work-items"),
    path("work-items/<str:item_id>", api_views.work_item_detail, name="work-item"),
    path("accounts", api_views.account_list, name="accounts"),
    path("drains", api_views.drain_list, name="drains"),
    path("drains/<str:drain_id>", api_views.drain_detail, name="drain"),
    path("attention", api_worklists.attention, name="attention"),
    path("delivered", api_worklists.delivered, name="delivered"),
]
