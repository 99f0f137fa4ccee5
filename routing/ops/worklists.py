"""/ops/attention/ (what failed, timed out, was dead-lettered or was not delivered, and
why) and /ops/delivered/ (the pull requests and branches loopsweb delivered): the rows of
routing.worklists, filtered by the query string and paginated as the other /ops lists.

Both show runs' errors and what their steps used (accounts, tokens, cost), so they need
the runs' and steps' view permissions, as the item page's runs do. A filter that does not
parse answers 400: the page with the reason, listing nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from ledger.webkit import access
from ledger.webkit.paging import CappedCountPaginator
from routing import worklists
from routing.ops.views import PER_PAGE, ops_view, render_page

Rows = Callable[[Iterable[Any]], list[Any]]


def _listing(
    request: HttpRequest,
    form: worklists.WorklistFilterForm,
    query: Callable[..., QuerySet[Any]],
    rows: Rows,
) -> dict[str, Any]:
    """The page's rows, its pager and the filters as given (the pager's and the filter
    links' query string); `error` when a filter does not parse."""
    given = {
        name: request.GET[name]
        for name in form.filter_names
        if request.GET.get(name, "").strip()
    }
    if not form.is_valid():
        return {"filters": given, "error": form.first_error(), "page": None, "rows": []}
    paginator = CappedCountPaginator(query(**worklists.filters_of(form)), PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    return {"filters": given, "error": None, "page": page, "rows": rows(page)}


def _answer(
    request: HttpRequest,
    section: str,
    title: str,
    listing: dict[str, Any],
    **extra: Any,
) -> HttpResponse:
    """The page `templates/ops/<section>.html`; 400 when a filter did not parse."""
    response = render_page(
        request,
        f"ops/{section}.html",
        title,
        section,
        now=timezone.now(),
        **listing,
        **extra,
    )
    if listing["error"]:
        response.status_code = 400
    return response


@ops_view(access.RUNS, access.STEPS)
def attention(request: HttpRequest) -> HttpResponse:
    """Work items that failed, timed out, were dead-lettered by the re-dispatch bound or
    were not delivered, newest first, each with its reason, the accounts its run used and
    what it cost."""
    form = worklists.AttentionFilterForm(request.GET)
    listing = _listing(
        request, form, worklists.attention_items, worklists.attention_rows
    )
    return _answer(
        request,
        "attention",
        "Needs attention",
        listing,
        kinds=list(worklists.ATTENTION_KINDS.items()),
        kind_counts=worklists.attention_summary(),
    )


@ops_view(access.RUNS, access.STEPS)
def delivered(request: HttpRequest) -> HttpResponse:
    """Runs whose work went out: the pull request (its state as recorded) or the pushed
    branch, the item, the accounts and the cost."""
    form = worklists.DeliveredFilterForm(request.GET)
    listing = _listing(
        request, form, worklists.delivered_runs, worklists.delivered_rows
    )
    return _answer(
        request,
        "delivered",
        "Delivered",
        listing,
        states=list(worklists.DELIVERED_STATES.items()),
    )
