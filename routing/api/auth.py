"""The one way into the JSON API and /metrics: a bearer token with a scope, or a staff session.

Contract of `api_auth(scope, methods=..., allow_staff=...)`:
1. `Authorization: Bearer <token>` present: the token must be live (401 otherwise; an expired
   one's 401 says when it expired) and carry `scope` (403 otherwise). A bad token is refused even when a staff session is also present,
   so a script never succeeds by accident through a browser cookie.
2. No Authorization header: with `allow_staff` (read views) a staff session passes when it
   holds the work items' view permission and `perms` (the view permissions of what the
   endpoint shows: ledger.webkit.access, as on /ops/), and a signed-in user who is not staff
   or lacks one gets 403; anyone else, and every session on token-only views, gets 401 with
   `WWW-Authenticate: Bearer`.
3. Only then the method: anything outside `methods` is 405 with `Allow`. Authenticating first
   means anonymous callers learn nothing, not even which methods exist.
Every refusal is JSON `{"error": "..."}`. Every view behind `api_auth` is `csrf_exempt`, so
a token client's PUT or DELETE gets the JSON 405 rather than Django's HTML CSRF page. That
is safe: bearer tokens are not ambient credentials, the only view that writes (ingest)
refuses sessions, and a session's unsafe method on a read view is refused (405) before the
view runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from ledger.webkit import access
from routing.api.tokens import TOKEN_INVALID, api_token_authenticate, api_token_refusal
from routing.models import ApiToken

View = Callable[..., HttpResponse]

AUTH_REQUIRED = "authentication required: send Authorization: Bearer <token>"
AUTH_MALFORMED = "malformed Authorization header (expected: Bearer <token>)"
AUTH_INVALID = TOKEN_INVALID
AUTH_SCOPE = "this token lacks the {scope!r} scope"
AUTH_NOT_STAFF = "staff access required"
AUTH_PERMISSION = "this staff user needs the view permissions {perms}"
METHOD_NOT_ALLOWED = "method {method} not allowed"


def json_error(message: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _bearer(request: HttpRequest) -> str | None:
    """The presented token; "" for a malformed header; None when there is no header."""
    header = request.META.get("HTTP_AUTHORIZATION")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return ""
    return token.strip()


def api_auth(
    scope: str,
    *,
    methods: Iterable[str] = ("GET",),
    allow_staff: bool = True,
    perms: Iterable[str] = (),
) -> Callable[[View], View]:
    # HEAD is answered wherever GET is (the GET's headers, no body: Django's handler drops it).
    allowed = tuple(methods)
    needed = (access.ITEMS, *perms)
    if "GET" in allowed:
        allowed += ("HEAD",)

    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            token = _bearer(request)
            api_token: ApiToken | None = None
            if token is not None:
                if not token:
                    return json_error(AUTH_MALFORMED, 401, WWW_Authenticate="Bearer")
                api_token = api_token_authenticate(token)
                if api_token is None:
                    # "invalid or revoked token", or "token expired at …" for an expired one
                    return json_error(
                        api_token_refusal(token), 401, WWW_Authenticate="Bearer"
                    )
                if scope not in (api_token.scopes or []):
                    return json_error(AUTH_SCOPE.format(scope=scope), 403)
            else:
                user = getattr(request, "user", None) if allow_staff else None
                if user is None or not user.is_authenticated:
                    return json_error(AUTH_REQUIRED, 401, WWW_Authenticate="Bearer")
                if not access.is_staff(user):
                    return json_error(AUTH_NOT_STAFF, 403)
                if not access.may_view(user, *needed):
                    return json_error(
                        AUTH_PERMISSION.format(perms=", ".join(needed)), 403
                    )
            if request.method not in allowed:
                return json_error(
                    METHOD_NOT_ALLOWED.format(method=request.method),
                    405,
                    Allow=", ".join(allowed),
                )
            request.api_token = api_token  # type: ignore[attr-defined]
            return view(request, *args, **kwargs)

        return csrf_exempt(wrapper)

    return decorator
