"""Health endpoints, without authentication and with no data beyond statuses and ages, so a
load balancer, systemd, Kubernetes or a monitor may poll them; plain HTTP is not redirected
(settings.SECURE_REDIRECT_EXEMPT). The reads are in routing.ops.health.selectors.

- `GET /livez`: 200 while this process answers requests (no database read): restart it
  when this fails.
- `GET /healthz` (and `GET /readyz`, the same): 200 when this web process can serve, i.e. its
  database answers; 503 otherwise. Point a load balancer's health check here: it stays 200 on
  a web machine whose clusters are down.
- `GET /health/installation`: 200 when the database answers and both clusters reported
  within their interval, 503 naming what is wrong otherwise (what `manage.py health` says).
  For monitoring and alerts, never for taking a web machine out of rotation.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from routing.ops.health.selectors import health_report, web_health

RETRY_AFTER_SECONDS = "10"


def _answer(body: dict[str, Any], healthy: bool) -> JsonResponse:
    response = JsonResponse(body, status=200 if healthy else 503)
    if not healthy:
        response["Retry-After"] = RETRY_AFTER_SECONDS
    return response


@never_cache
@require_safe
def livez(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    report = web_health()
    return _answer(report.as_json(), report.healthy)


@never_cache
@require_safe
def installation_health(request: HttpRequest) -> JsonResponse:
    report = health_report()
    return _answer(report.as_json(), report.healthy)
