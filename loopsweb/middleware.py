"""Request guards that hold for every URL (admin, ops, API)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict

FORM_CONTENT_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
NUL_IN_PARAMETER = "parameter {name!r} holds a NUL character"


def _nul_parameter(params: QueryDict) -> str | None:
    """The first parameter whose name or a value holds NUL, else None."""
    for name, values in params.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return name.replace("\x00", "\\x00")
    return None


class RejectUnstorablePathMiddleware:
    """Refuse NUL before any view can hand it to the database.

    PostgreSQL text refuses NUL even in a WHERE clause (DataError, a 500), and every filter
    of the admin, the ops pages and the API reaches a query. So, once for every URL:
    - a path holding NUL names no row: 404;
    - a query-string or form parameter (name or value) holding NUL: 400.
    Both answers are JSON `{"error": ...}`. Other request bodies (the API's JSON) are
    checked by their parser.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path:
            return JsonResponse({"error": "not found"}, status=404)
        bad = _nul_parameter(request.GET)
        if bad is None and request.content_type in FORM_CONTENT_TYPES:
            bad = _nul_parameter(request.POST)
        if bad is not None:
            return JsonResponse(
                {"error": NUL_IN_PARAMETER.format(name=bad)}, status=400
            )
        return self.get_response(request)


class OneLineWarning(logging.Filter):
    """A record as one WARNING line, its traceback dropped: for `DisallowedHost` (a request
    naming a host not in ALLOWED_HOSTS), which Django logs at ERROR with a 15-line traceback
    although nothing failed; a scanner sending such requests would fill the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = record.stack_info = None
        return True
