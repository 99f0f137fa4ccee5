"""`GET /healthz`: 200 when the database answers and both clusters reported within their
interval, 503 naming what is wrong otherwise (routing.ops.health.selectors). No
authentication and no data beyond statuses and ages, so a load balancer, systemd or a
container runtime may poll it; plain HTTP is not redirected (settings.SECURE_REDIRECT_EXEMPT).
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from routing.ops.health.selectors import health_report


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    report = health_report()
    response = JsonResponse(report.as_json(), status=200 if report.healthy else 503)
    if not report.healthy:
        response["Retry-After"] = "10"
    return response
