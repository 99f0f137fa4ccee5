"""Request guards that hold for every URL (admin, ops, API)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse


class RejectUnstorablePathMiddleware:
    """404 for a path holding a NUL character.

    Such a path can never name a row (PostgreSQL text refuses NUL), but a lookup with it
    raises DataError inside any view that queries by a path parameter: answer before that.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path:
            return JsonResponse({"error": "not found"}, status=404)
        return self.get_response(request)
