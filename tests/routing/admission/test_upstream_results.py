"""Upstream's result fields (docs/upstream.md §3.8, §5.3) and lifecycle error messages (docs/upstream.md §2.1), word for word."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.utils import timezone

from ledger import services
from ledger.models import RunStatus, WorkflowRun, WorkflowWorkItem, WorkItemStatus
from ledger.services import LedgerError, work_item_admit
from routing.drains.inbox import inbox_ingest
from tests.routing.helpers import created_route, generic_event, route

pytestmark = pytest.mark.django_db


def test_a_throttled_route_result_is_skipped_and_queued_at_source() -> None:
    created = route(event=generic_event(project="/srv/x"), max_active="1")
    throttled = route(event=generic_event(project="/srv/x"), max_active="1")
    assert created.kind == "created" and throttled.kind == "throttled"
    value = throttled.to_dict()
    assert value["skipped"] is True and value["queuedAtSource"] is True
    assert value["workItem"]["status"] == "deferred"
    assert "skipped" not in created.to_dict()
    assert "queuedAtSource" not in created.to_dict()


def test_route_event_json_carries_the_throttled_fields() -> None:
    route(event=generic_event(project="/srv/y"), max_active="1")
    out = io.StringIO()
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(generic_event(project="/srv/y")),
        "--max-active",
        "1",
        "--json",
        stdout=out,
    )
    value = json.loads(out.getvalue())
    assert value["kind"] == "throttled"
    assert value["skipped"] is True and value["queuedAtSource"] is True


def test_compact_drain_results_carry_queued_at_source() -> None:
    inbox_ingest(
        enumerate(
            [generic_event(project="/srv/z"), generic_event(project="/srv/z")], start=1
        )
    )
    out = io.StringIO()
    call_command(
        "drain",
        "generic",
        "--max-dispatch",
        "5",
        "--max-active-per-project",
        "1",
        "--json",
        "--compact",
        stdout=out,
    )
    results = json.loads(out.getvalue())["results"]
    kinds = {r["kind"]: r for r in results}
    assert set(kinds) == {"created", "throttled"}
    assert kinds["throttled"]["queuedAtSource"] is True
    assert "queuedAtSource" not in kinds["created"]


def test_admitting_an_item_that_is_not_queued_or_deferred_is_refused_as_upstream() -> (
    None
):
    result = created_route(route(event=generic_event()))
    item = result.work_item
    assert item.status == WorkItemStatus.ADMITTED
    with pytest.raises(LedgerError) as err:
        work_item_admit(
            item=item,
            spec=result.workflow,
            invocation=result.invocation,
            loop_name="again",
            loop_description="again",
            reason="admitted by generic-event route",
            now=timezone.now(),
        )
    assert str(err.value) == (
        f"workflow work item is not claimable: {item.id} status=admitted"
    )


def test_starting_a_run_for_an_item_that_is_not_runnable_is_refused_as_upstream() -> (
    None
):
    result = route(event=generic_event())
    assert result.run is not None and result.work_item is not None
    WorkflowWorkItem.objects.filter(pk=result.work_item.pk).update(
        status=WorkItemStatus.SUCCEEDED
    )
    assert services.run_claim(run_id=result.run.id, worker="w:1") is None
    run = WorkflowRun.objects.get(pk=result.run.pk)
    assert run.status == RunStatus.CANCELLED
    assert run.error == (
        f"workflow work item is not runnable: {result.work_item.id} status=succeeded"
    )
