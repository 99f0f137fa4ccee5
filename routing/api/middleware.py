"""JSON answers for every status under /api/, /metrics and /hooks/, 500 and 503 included.

Producers and scrapers parse the body of every answer, so a failure inside a view (or a
database that cannot be reached) must not fall through to Django's HTML error pages:
- a database error that passes (`ledger.dberrors.error_passes`: unreachable, a dropped
  connection, too many connections, a full disk, read-only, a deadlock; and any other
  OperationalError or InterfaceError): 503 `{"error": ...}` with `Retry-After`; the request
  wrote nothing it did not commit, so the client may retry;
- any other exception: 500 `{"error": ...}`, logged with its traceback (never sent).
- a request line longer than MAX_URL_CHARS: 414 `{"error": ...}` (gunicorn, which would
  answer an HTML 414 above 4094 characters itself, lets lines up to 1 MiB through to here:
  loopsweb/gunicorn.conf.py `limit_request_line = 0`).
Other paths keep Django's own pages.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import csrf as csrf_views
from django.views import defaults

from ledger.dberrors import error_passes, writes_refused

logger = logging.getLogger("routing.api")

API_PREFIXES = ("/api/", "/metrics", "/hooks/")
DATABASE_UNAVAILABLE = "database unavailable; retry later"
DATABASE_REFUSES_WRITES = "database refuses writes (full or read-only); retry later"
INTERNAL_ERROR = "internal error"
RETRY_AFTER_SECONDS = "5"
# gunicorn's own largest request line (its MAX_REQUEST_LINE): what a client could send before.
MAX_URL_CHARS = 8190
URL_TOO_LONG = "request URI too long: at most {limit} characters"


def is_api_path(path: str) -> bool:
    return path.startswith(API_PREFIXES)


def api_exception_response(request: HttpRequest, exc: BaseException) -> JsonResponse:
    if error_passes(exc) or isinstance(exc, (OperationalError, InterfaceError)):
        logger.error(
            "database unavailable during %s %s: %s", request.method, request.path, exc
        )
        error = DATABASE_REFUSES_WRITES if writes_refused(exc) else DATABASE_UNAVAILABLE
        response = JsonResponse({"error": error}, status=503)
        response["Retry-After"] = RETRY_AFTER_SECONDS
        return response
    logger.error(
        "internal error during %s %s",
        request.method,
        request.path,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return JsonResponse({"error": INTERNAL_ERROR}, status=500)


class ApiErrorMiddleware:
    """Turns an exception raised by an API view into a JSON 503/500 (see the module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if is_api_path(request.path) and len(request.get_full_path()) > MAX_URL_CHARS:
            return JsonResponse(
                {"error": URL_TOO_LONG.format(limit=MAX_URL_CHARS)}, status=414
            )
        return self.get_response(request)

    def process_exception(
        self, request: HttpRequest, exc: Exception
    ) -> HttpResponse | None:
        if not is_api_path(request.path):
            return None
        return api_exception_response(request, exc)


# URLconf handlers and the CSRF failure view (loopsweb.urls, settings.CSRF_FAILURE_VIEW):
# JSON under the API prefixes, Django's own pages elsewhere.


def bad_request(
    request: HttpRequest, exception: Exception | None = None
) -> HttpResponse:
    if is_api_path(request.path):  # a bad Host header, a malformed request: 400
        return JsonResponse({"error": "bad request"}, status=400)
    return defaults.bad_request(request, exception or Exception())


def permission_denied(
    request: HttpRequest, exception: Exception | None = None
) -> HttpResponse:
    if is_api_path(request.path):
        return JsonResponse({"error": "permission denied"}, status=403)
    return defaults.permission_denied(request, exception or Exception())


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_path(request.path):
        return JsonResponse({"error": "not found"}, status=404)
    return defaults.page_not_found(request, exception or Http404())


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api_path(request.path):
        exc = sys.exc_info()[1]
        if exc is not None:
            return api_exception_response(request, exc)
        return JsonResponse({"error": INTERNAL_ERROR}, status=500)
    return defaults.server_error(request)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if is_api_path(request.path):
        return JsonResponse(
            {"error": f"CSRF verification failed: {reason}"}, status=403
        )
    return csrf_views.csrf_failure(request, reason=reason)
