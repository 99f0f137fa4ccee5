"""Reads behind the JSON API: filtered querysets with a fixed number of queries per page.

- Lists page with a keyset cursor on (timestamp, id) descending: a page costs the same at
  the millionth row as at the first, and rows inserted meanwhile never shift a page.
- Related rows come from `prefetch_related` (one query per relation, whatever the row count);
  large columns (step output, drain results) are deferred where a view does not show them.
- Caps and account rows come from `routing.selectors` (the reads the web surfaces share), so
  the API, /metrics and the ops pages agree on which cap applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.db.models import Exists, Model, OuterRef, Prefetch, Q, QuerySet

from ledger.models import (
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemDeferral,
)
from routing.models import DrainRecord, InboxEvent

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class Page(Generic[M]):
    rows: list[M]
    # (timestamp, id) of the last row when more rows follow, else None
    next_key: tuple[datetime, str] | None


def keyset_page(
    queryset: QuerySet[M],
    *,
    time_field: str,
    after: tuple[datetime, str] | None,
    limit: int,
) -> Page[M]:
    """One page of `queryset` ordered by (time_field, id) descending, after a cursor key.

    Fetches limit + 1 rows to learn whether another page follows, in the same query.
    """
    if after is not None:
        moment, row_id = after
        queryset = queryset.filter(
            Q(**{f"{time_field}__lt": moment})
            | Q(**{time_field: moment, "id__lt": row_id})
        )
    rows = list(queryset.order_by(f"-{time_field}", "-id")[: limit + 1])
    if len(rows) <= limit:
        return Page(rows=rows, next_key=None)
    rows = rows[:limit]
    last = rows[-1]
    return Page(rows=rows, next_key=(getattr(last, time_field), str(last.pk)))


def work_items(
    *,
    status: str | None = None,
    route_scope: str | None = None,
    project: str | None = None,
    reason_code: str | None = None,
    account: str | None = None,
) -> QuerySet[WorkflowWorkItem]:
    """Work items matching every given filter (one query; no related rows needed).

    `account`: items with a run that had a step on that account, as an EXISTS over the
    item's runs (idx_workflow_runs_work_item) and their steps, so no join multiplies rows.
    """
    items = WorkflowWorkItem.objects.all()
    exact: dict[str, Any] = {
        "status": status,
        "route_scope": route_scope,
        "project_key": project,
        "reason_code": reason_code,
    }
    items = items.filter(**{k: v for k, v in exact.items() if v})
    if account:
        items = items.filter(
            Exists(
                WorkflowStepRun.objects.filter(
                    workflow_run__work_item=OuterRef("pk"), account_profile=account
                )
            )
        )
    return items


def work_item_detail(item_id: str) -> WorkflowWorkItem | None:
    """One item with its deferral history, runs with their steps, and inbox deliveries.

    Six queries whatever the history: the item, then one per prefetched relation.
    """
    steps = WorkflowStepRun.objects.order_by("sequence").defer("stdout", "stderr")
    return (
        WorkflowWorkItem.objects.filter(pk=item_id)
        .select_related("invocation")
        .prefetch_related(
            Prefetch(
                "deferrals", queryset=WorkItemDeferral.objects.order_by("created_at")
            ),
            Prefetch(
                "runs",
                queryset=WorkflowRun.objects.order_by(
                    "created_at", "id"
                ).prefetch_related(
                    Prefetch("step_runs", queryset=steps),
                    Prefetch(
                        "step_runs__attempts",
                        queryset=WorkflowStepAttempt.objects.order_by(
                            "started_at", "id"
                        ),
                    ),
                ),
            ),
            Prefetch(
                "inbox_events",
                queryset=InboxEvent.objects.order_by("received_at").only(
                    "id",
                    "source",
                    "event_id",
                    "event_type",
                    "state",
                    "received_at",
                    "work_item_id",
                ),
            ),
        )
        .first()
    )


def drains(
    *, kind: str | None = None, route_scope: str | None = None
) -> QuerySet[DrainRecord]:
    """Drain records, without their per-item results (the list shows counts only)."""
    records = DrainRecord.objects.defer("results_json")
    if kind:
        records = records.filter(kind=kind)
    if route_scope:
        records = records.filter(route_scope=route_scope)
    return records
