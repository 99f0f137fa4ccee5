"""`GET /api/v1/attention` and `GET /api/v1/delivered`: the rows of /ops/attention/ and
/ops/delivered/ (routing.worklists) as JSON, with the same filters and keyset pages as
the other lists (`limit`, `cursor`, `nextCursor`; unknown parameters refused).

Both show runs' errors and what their steps used, so a staff session needs the runs' and
steps' view permissions as well, as for an item's detail; a token needs `read`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.webkit import access
from routing import worklists
from routing.api.auth import api_auth, json_error
from routing.api.forms import PageForm
from routing.api.selectors import keyset_page
from routing.api.serializers import TokensDict, cursor_encode, iso, tokens_dict


class AttentionQueryForm(PageForm, worklists.AttentionFilterForm):
    pass


class DeliveredQueryForm(PageForm, worklists.DeliveredFilterForm):
    pass


class FailedStepDict(TypedDict):
    stepId: str
    status: str
    # StepReasonCode: rate_limited, login_failed or failed
    reasonCode: str | None


class AttentionDict(TypedDict):
    workItemId: str
    title: str
    status: str
    kinds: list[str]
    routeKey: str
    routeScope: str | None
    projectKey: str | None
    attempts: int
    reason: str | None
    deliveryError: str | None
    failedStep: FailedStepDict | None
    runId: str | None
    runStatus: str | None
    updatedAt: str | None
    accounts: list[str]
    usage: TokensDict | None


class PullRequestDict(TypedDict):
    repo: str | None
    number: int | None
    url: str | None
    state: str
    draft: bool


class DeliveredDict(TypedDict):
    runId: str
    runStatus: str
    workItemId: str | None
    title: str
    projectKey: str | None
    routeScope: str | None
    state: str
    pullRequest: PullRequestDict | None
    branch: str
    commit: str | None
    remoteUrl: str | None
    deliveredAt: str | None
    finishedAt: str | None
    accounts: list[str]
    usage: TokensDict | None


def attention_to_dict(row: worklists.AttentionRow) -> AttentionDict:
    item, run, step = row.item, row.run, row.spend.failed_step
    return AttentionDict(
        workItemId=item.id,
        title=row.title,
        status=item.status,
        kinds=row.kinds,
        routeKey=item.route_key,
        routeScope=item.route_scope,
        projectKey=item.project_key,
        attempts=item.attempts,
        reason=row.reason or None,
        deliveryError=row.delivery_error or None,
        failedStep=FailedStepDict(
            stepId=step.step_id, status=step.status, reasonCode=step.reason_code or None
        )
        if step is not None
        else None,
        runId=run.id if run is not None else None,
        runStatus=run.status if run is not None else None,
        updatedAt=iso(item.updated_at),
        accounts=row.spend.accounts,
        usage=tokens_dict(row.spend.usage),
    )


def delivered_to_dict(row: worklists.DeliveredRow) -> DeliveredDict:
    item, pr = row.item, row.pr
    return DeliveredDict(
        runId=row.run.id,
        runStatus=row.run.status,
        workItemId=item.id if item is not None else None,
        title=row.title,
        projectKey=item.project_key if item is not None else None,
        routeScope=item.route_scope if item is not None else None,
        state=row.state,
        pullRequest=PullRequestDict(
            repo=pr.get("repo"),
            number=pr.get("number"),
            url=pr.get("url"),
            state=row.state,
            draft=bool(pr.get("draft")),
        )
        if pr
        else None,
        branch=row.branch,
        commit=row.commit or None,
        remoteUrl=row.remote or None,
        deliveredAt=iso(row.delivered_at),
        finishedAt=iso(row.run.finished_at),
        accounts=row.spend.accounts,
        usage=tokens_dict(row.spend.usage),
    )


def _listing(
    form: PageForm,
    key: str,
    query: Callable[..., QuerySet[Any]],
    rows: Callable[[list[Any]], list[Any]],
    serialize: Callable[[Any], Any],
    *,
    time_field: str,
) -> HttpResponse:
    """One keyset page, `{key: [...], "nextCursor": ...}`, or the filter's 400."""
    if not form.is_valid():
        return json_error(form.first_error(), 400)
    assert isinstance(form, worklists.WorklistFilterForm)
    page = keyset_page(
        query(**worklists.filters_of(form)),
        time_field=time_field,
        after=form.cleaned_data["cursor"],
        limit=form.cleaned_data["limit"],
    )
    return JsonResponse(
        {
            key: [serialize(row) for row in rows(page.rows)],
            "nextCursor": cursor_encode(page.next_key) if page.next_key else None,
        }
    )


@api_auth("read", perms=(access.RUNS, access.STEPS))
def attention(request: HttpRequest) -> HttpResponse:
    """Work items that need attention (routing.worklists), newest change first."""
    return _listing(
        AttentionQueryForm(request.GET),
        "attention",
        worklists.attention_items,
        worklists.attention_rows,
        attention_to_dict,
        time_field="updated_at",
    )


@api_auth("read", perms=(access.RUNS, access.STEPS))
def delivered(request: HttpRequest) -> HttpResponse:
    """Delivered runs (routing.worklists), last finished first."""
    return _listing(
        DeliveredQueryForm(request.GET),
        "delivered",
        worklists.delivered_runs,
        worklists.delivered_rows,
        delivered_to_dict,
        time_field="finished_at",
    )
