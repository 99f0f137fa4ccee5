from __future__ import annotations

from django.urls import URLPattern, path

from routing.metrics.views import metrics_view

app_name = "metrics"
urlpatterns: list[URLPattern] = [
    path("metrics", metrics_view, name="metrics"),
]
