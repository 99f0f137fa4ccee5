from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from routing.github_hooks import github_hook
from routing.ops.health.views import healthz, installation_health, livez

admin.autodiscover()  # here, not at start-up: loopsweb/admin_site.py

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/", include("routing.ops.urls")),
    path("api/v1/", include("routing.api.urls")),
    path("", include("routing.metrics.urls")),
    # GitHub's webhooks, authenticated by their signature (routing.github_hooks)
    path("hooks/github/", github_hook, name="github-hook"),
    # health, no authentication, no data (routing.ops.health): this web process and its
    # database for load balancers; the whole installation (clusters) for monitoring
    path("healthz", healthz, name="healthz"),
    path("readyz", healthz, name="readyz"),
    path("livez", livez, name="livez"),
    path("health/installation", installation_health, name="health-installation"),
]

# JSON under /api/ and /metrics, Django's pages elsewhere (routing.api.middleware).
handler400 = "routing.api.middleware.bad_request"
handler403 = "routing.api.middleware.permission_denied"
handler404 = "routing.api.middleware.not_found"
handler500 = "routing.api.middleware.server_error"
