"""The JSON API under /api/v1/: event ingest for producers, reads for dashboards and scripts.

`POST /events` takes the request apart in a fixed order, each step a 4xx with
`{"error": ...}` and no write when it fails:
1. auth (token with `ingest`), then the query string (IngestQueryForm), then the content
   type (415), then the size: Content-Length, then the bytes actually read (413);
2. the body: UTF-8, nesting depth, JSON, storable values (400; `domain.jsontext`);
   an array longer than LOOPSWEB_API_MAX_EVENTS is 413;
3. with `route=now`, every envelope must plan under the given kind (without one, the kind
   its type selects, as a drain's source filter: `task.*` is todos-task) and options (400);
4. envelopes that can never route (planned under the kind their type selects, with no caps:
   a todos task without an id or the opt-in, a generic event without a project) are listed
   under `warnings`; with `strict=1` the request is refused (400) and nothing is stored;
5. `inbox_ingest`, all or nothing and idempotent on (source, id) (400 on any bad envelope);
6. with `route=now`, each accepted event goes through `route_event` and its inbox row is
   updated as a drain would, one transaction per event.
The answer is 202: the events are stored; admitted runs start later.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from django.conf import settings
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from domain.errors import ApplicationError
from domain.events import Envelope, parse_envelope
from domain.jsontext import loads_limited
from domain.keys import TODOS_TASK
from ledger.webkit import access
from routing.admission import (
    SKIPPED,
    RouteOptions,
    RoutePlan,
    RouteRefused,
    plan_reads,
    plan_route,
    route_event,
)
from routing.api import selectors as api_selectors
from routing.api.auth import api_auth, json_error
from routing.api.forms import (
    DrainQueryForm,
    IngestQueryForm,
    StrictQueryForm,
    WorkItemQueryForm,
)
from routing.api.serializers import (
    account_to_dict,
    cursor_encode,
    drain_detail_to_dict,
    drain_to_dict,
    work_item_detail_to_dict,
    work_item_summary,
)
from routing.drains import compact_result, inbox_record_hold, inbox_record_route
from routing.drains.configs import drain_configs
from routing.drains.inbox import IngestRejected, IngestReport, inbox_ingest
from routing.drains.routable import (
    kind_for_event_type,
    never_routable,
    never_routes_message,
)
from routing.models import DrainRecord, InboxEvent
from routing.selectors import account_rows

_Row = TypeVar("_Row", bound=Model)

JSON_CONTENT_TYPE = "application/json"
UNSUPPORTED_TYPE = "Content-Type must be application/json (UTF-8)"
BODY_TOO_LARGE = "request body is larger than {limit} bytes"
BATCH_TOO_LONG = "at most {limit} envelopes per request"
BATCH_EMPTY = "the array holds no envelopes"
KindOf = Callable[[Envelope], str]
"""The route kind an envelope is routed as (`kind`, else the one its type selects)."""

NOT_ROUTABLE = "{n} envelope(s) cannot be routed as {kind}; first at {at}: {error}"
NOT_FOUND = "not found"


def _form_error(form: StrictQueryForm) -> JsonResponse:
    return json_error(form.first_error(), 400)


def _content_type_ok(request: HttpRequest) -> bool:
    charset = (request.content_params or {}).get("charset", "utf-8").lower()
    return request.content_type == JSON_CONTENT_TYPE and charset in ("utf-8", "utf8")


def read_body(request: HttpRequest, limit: int) -> bytes | None:
    """The body, or None when it is larger than `limit` (judged before and while reading).

    Reads from the stream instead of `request.body`, whose own size guard answers an HTML
    400 rather than our JSON 413.
    """
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return None
    body = request.read(limit + 1)
    return None if len(body) > limit else body


def _plan_errors(
    items: list[Any], *, kind_of: KindOf, options: RouteOptions, cwd: str
) -> list[dict[str, Any]]:
    """Envelopes that are valid but cannot be routed with their kind and these options."""
    errors: list[dict[str, Any]] = []
    reads = plan_reads(accounts=False)
    for position, obj in enumerate(items, start=1):
        try:
            envelope = parse_envelope(obj)
        except ApplicationError:
            continue  # inbox_ingest reports malformed envelopes, with every other one
        kind = kind_of(envelope)
        try:
            plan = plan_route(
                kind=kind,
                envelope=envelope,
                options=options,
                env={},
                cwd=cwd,
                reads=reads,
            )
        except ApplicationError as exc:
            errors.append({"at": f"item {position}", "kind": kind, "error": str(exc)})
            continue
        if (
            isinstance(plan, RoutePlan)
            and plan.refusal
            and plan.route_key != TODOS_TASK
        ):
            # Only a todos task is deduped before its worktree check
            # (docs/upstream.md §3.2.9); any other route with this refusal can never be admitted.
            errors.append(
                {"at": f"item {position}", "kind": kind, "error": plan.refusal}
            )
    return errors


def _route_accepted(
    report: IngestReport,
    envelopes: dict[tuple[str, str], Envelope],
    *,
    kind_of: KindOf,
    options: RouteOptions,
    cwd: str,
) -> list[dict[str, Any]]:
    """Route each newly stored event now, recording the outcome on its inbox row.

    route_event decides under the admission lock, and the inbox row records the outcome in
    the same transaction (`then`). The env is empty so the scope never comes from the web
    server's environment.
    """
    inbox_ids: dict[tuple[str, str], str] = {}
    by_source: dict[str, list[str]] = {}
    for ref in report.new:
        by_source.setdefault(ref["source"], []).append(ref["id"])
    for source, ids in by_source.items():
        rows = InboxEvent.objects.filter(source=source, event_id__in=ids)
        for row_id, event_id in rows.values_list("id", "event_id"):
            inbox_ids[(source, event_id)] = row_id
    results = []
    for ref in report.new:
        key = (ref["source"], ref["id"])
        envelope, inbox_id = envelopes[key], inbox_ids[key]
        now = timezone.now()
        kind = kind_of(envelope)
        try:
            result = route_event(
                kind=kind,
                envelope=envelope,
                options=options,
                env={},
                cwd=cwd,
                then=partial(inbox_record_route, inbox_id, now=now),
            )
            results.append({**compact_result(result.to_dict()), "routeKind": kind})
        except ApplicationError as exc:
            # A todos task refused after its early dedupe (worktree required, no git work
            # tree) is a route error, skipped as a drain skips it (docs/upstream.md §5.2.3).
            # Anything else planned successfully a moment ago, so it is rare (e.g.
            # a template changed): recorded like a drain's fatal item. The batch goes on.
            failed = {
                "kind": SKIPPED,
                "skipped": True,
                "reason": str(exc),
                "event": {"id": envelope.id, "type": envelope.type},
            }
            failed["routeError" if isinstance(exc, RouteRefused) else "fatal"] = True
            inbox_record_hold(inbox_id, failed, now)
            results.append({**compact_result(failed), "routeKind": kind})
    return results


def _batch_items(request: HttpRequest) -> list[Any] | JsonResponse:
    """The envelopes the body holds (one object or an array of them), or the 4xx refusing
    the request: its content type (415), its size (413), its JSON (400), its count."""
    if not _content_type_ok(request):
        return json_error(UNSUPPORTED_TYPE, 415)
    limit = settings.LOOPSWEB_MAX_EVENT_BYTES
    body = read_body(request, limit)
    if body is None:
        return json_error(BODY_TOO_LARGE.format(limit=limit), 413)
    try:
        payload = loads_limited(
            body, max_depth=settings.LOOPSWEB_MAX_JSON_DEPTH, array_wrapper=True
        )
    except ApplicationError as exc:
        return json_error(str(exc), 400)
    items = payload if isinstance(payload, list) else [payload]
    if not items:
        return json_error(BATCH_EMPTY, 400)
    if len(items) > settings.LOOPSWEB_API_MAX_EVENTS:
        return json_error(
            BATCH_TOO_LONG.format(limit=settings.LOOPSWEB_API_MAX_EVENTS), 413
        )
    return items


def _unroutable_response(
    items: list[Any], *, kind_of: KindOf, options: RouteOptions, cwd: str
) -> JsonResponse | None:
    """The 400 for `route=now` when an envelope cannot plan under its kind and these
    options; None when every one can."""
    unroutable = _plan_errors(items, kind_of=kind_of, options=options, cwd=cwd)
    if not unroutable:
        return None
    first = unroutable[0]
    message = NOT_ROUTABLE.format(
        n=len(unroutable),
        kind=first["kind"],
        at=first["at"],
        error=first["error"],
    )
    return JsonResponse({"error": message, "invalid": unroutable}, status=400)


def _routed_now(
    items: list[Any],
    report: IngestReport,
    *,
    explicit: str | None,
    kind_of: KindOf,
    options: RouteOptions,
    cwd: str,
) -> dict[str, Any]:
    """The answer's `kind`, `kindFrom` and `results` for `route=now`, routing each newly
    stored event."""
    envelopes: dict[tuple[str, str], Envelope] = {}
    for obj in items:
        envelope = parse_envelope(obj)  # all valid: inbox_ingest accepted every one
        envelopes.setdefault((envelope.source, envelope.id), envelope)
    kinds = sorted({kind_of(envelope) for envelope in envelopes.values()})
    # Which kind routed the events: the one asked for, else the one their type selects
    # (`kindFrom: "event type"`; each result also names its `routeKind`).
    return {
        "kind": explicit or (kinds[0] if len(kinds) == 1 else kinds),
        "kindFrom": "kind" if explicit else "event type",
        "results": _route_accepted(
            report, envelopes, kind_of=kind_of, options=options, cwd=cwd
        ),
    }


@csrf_exempt
@api_auth("ingest", methods=("POST",), allow_staff=False)
def events(request: HttpRequest) -> HttpResponse:
    query = IngestQueryForm(request.GET)
    if not query.is_valid():
        return _form_error(query)
    items = _batch_items(request)
    if isinstance(items, JsonResponse):
        return items

    route_now = query.cleaned_data["route"] == "now"
    explicit: str | None = query.cleaned_data["kind"]
    options: RouteOptions = query.cleaned_data["route_options"]
    cwd = os.getcwd()

    def kind_of(envelope: Envelope) -> str:
        return explicit or kind_for_event_type(envelope.type)

    if route_now:
        refused = _unroutable_response(items, kind_of=kind_of, options=options, cwd=cwd)
        if refused is not None:
            return refused
    warnings = (
        []
        if route_now
        else never_routable(
            ((f"item {n}", obj) for n, obj in enumerate(items, start=1)), cwd=cwd
        )
    )
    if warnings and query.cleaned_data["strict"]:
        message = never_routes_message(warnings, flag="strict=1")
        return JsonResponse({"error": message, "warnings": warnings}, status=400)
    try:
        report = inbox_ingest(
            ((f"item {position}", obj) for position, obj in enumerate(items, start=1)),
            wake=not route_now,  # routed in this request
        )
    except IngestRejected as rejected:
        return JsonResponse(
            {"error": str(rejected), "invalid": rejected.report.invalid}, status=400
        )
    answer: dict[str, Any] = {
        "accepted": report.new,
        "duplicates": report.duplicate,
    }
    if warnings:
        answer["warnings"] = warnings
    if route_now:
        answer.update(
            _routed_now(
                items,
                report,
                explicit=explicit,
                kind_of=kind_of,
                options=options,
                cwd=cwd,
            )
        )
    return JsonResponse(answer, status=202)


def _page_response(
    key: str,
    rows: QuerySet[_Row],
    serialize: Callable[[_Row], Any],
    *,
    time_field: str,
    query: dict[str, Any],
) -> JsonResponse:
    """One keyset page of a list endpoint: `{key: [...], "nextCursor": ...}`; `query` is a
    list form's cleaned data (cursor, limit)."""
    page = api_selectors.keyset_page(
        rows, time_field=time_field, after=query["cursor"], limit=query["limit"]
    )
    return JsonResponse(
        {
            key: [serialize(row) for row in page.rows],
            "nextCursor": cursor_encode(page.next_key) if page.next_key else None,
        }
    )


@api_auth("read")
def work_item_list(request: HttpRequest) -> HttpResponse:
    form = WorkItemQueryForm(request.GET)
    if not form.is_valid():
        return _form_error(form)
    q = form.cleaned_data
    items = api_selectors.work_items(
        status=q["status"],
        route_scope=q["route_scope"],
        project=q["project"],
        reason_code=q["reason_code"],
        account=q["account"],
    )
    return _page_response(
        "workItems", items, work_item_summary, time_field="created_at", query=q
    )


@api_auth("read", perms=(access.RUNS, access.STEPS))
def work_item_detail(request: HttpRequest, item_id: str) -> HttpResponse:
    form = StrictQueryForm(request.GET)
    if not form.is_valid():
        return _form_error(form)
    # NUL cannot be in an id, and PostgreSQL refuses it even in a WHERE clause (a 500).
    item = None if "\x00" in item_id else api_selectors.work_item_detail(item_id)
    if item is None:
        return json_error(NOT_FOUND, 404)
    return JsonResponse(work_item_detail_to_dict(item))


@api_auth("read", perms=(access.ACCOUNTS,))
def account_list(request: HttpRequest) -> HttpResponse:
    form = StrictQueryForm(request.GET)
    if not form.is_valid():
        return _form_error(form)
    now = timezone.now()
    rows = account_rows(drain_configs(now=now), now=now)
    return JsonResponse({"accounts": [account_to_dict(row, now=now) for row in rows]})


@api_auth("read", perms=(access.DRAINS,))
def drain_list(request: HttpRequest) -> HttpResponse:
    form = DrainQueryForm(request.GET)
    if not form.is_valid():
        return _form_error(form)
    q = form.cleaned_data
    drains = api_selectors.drains(kind=q["kind"], route_scope=q["route_scope"])
    return _page_response(
        "drains", drains, drain_to_dict, time_field="started_at", query=q
    )


@api_auth("read", perms=(access.DRAINS,))
def drain_detail(request: HttpRequest, drain_id: str) -> HttpResponse:
    form = StrictQueryForm(request.GET)
    if not form.is_valid():
        return _form_error(form)
    drain = (
        None if "\x00" in drain_id else DrainRecord.objects.filter(pk=drain_id).first()
    )
    if drain is None:
        return json_error(NOT_FOUND, 404)
    return JsonResponse(drain_detail_to_dict(drain))
