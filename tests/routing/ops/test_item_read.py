"""One read of a work item (issue 42): the admin's work-item page and the /ops/ item page
render `ledger.item_read.work_item_read`, so they show the same runs with the same limit,
and the admin page's inbox deliveries are the section routing adds (the ledger never reads
routing's table)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ledger.item_read import RUNS_SHOWN
from ledger.models import RunStatus, StepStatus
from routing.models import InboxEvent, InboxState
from tests.factories import make_run, make_step_run, make_work_item

pytestmark = pytest.mark.django_db


def _runs_shown(html: str, run_ids: list[str]) -> set[str]:
    return {
        run_id
        for run_id in run_ids
        if reverse("admin:ledger_workflowrun_change", args=[run_id]) in html
    }


def test_both_pages_show_the_same_latest_runs_and_steps(admin_client) -> None:
    item = make_work_item(status="failed")
    runs = [
        make_run(work_item=item, status=RunStatus.FAILED) for _ in range(RUNS_SHOWN + 3)
    ]
    for run in runs:
        make_step_run(
            workflow_run=run,
            step_id="worker",
            status=StepStatus.FAILED,
            error=f"failed in {run.id}",
        )
    run_ids = [run.id for run in runs]
    admin_page = admin_client.get(
        reverse("admin:ledger_workflowworkitem_change", args=[item.id])
    ).content.decode()
    ops_page = admin_client.get(
        reverse("ops:work-item", args=[item.id])
    ).content.decode()

    # The latest by id (ids start with their creation time; rows made in one millisecond
    # are told apart by the rest of the id, so sort rather than trust creation order).
    latest = set(sorted(run_ids)[-RUNS_SHOWN:])
    assert _runs_shown(admin_page, run_ids) == latest
    assert _runs_shown(ops_page, run_ids) == latest
    for run_id in run_ids:
        shown = run_id in latest
        assert (f"failed in {run_id}" in admin_page) is shown
        assert (f"failed in {run_id}" in ops_page) is shown


def test_the_admin_page_lists_the_inbox_deliveries_routing_adds(admin_client) -> None:
    item = make_work_item(status="queued")
    event = InboxEvent.objects.create(
        source="ci",
        event_id="build-42",
        event_type="build.failed",
        state=InboxState.ADMITTED,
        work_item=item,
    )
    other = make_work_item(status="queued")
    page = admin_client.get(
        reverse("admin:ledger_workflowworkitem_change", args=[item.id])
    ).content.decode()
    assert 'id="item-inbox"' in page
    assert reverse("admin:routing_inboxevent_change", args=[event.pk]) in page
    empty = admin_client.get(
        reverse("admin:ledger_workflowworkitem_change", args=[other.id])
    ).content.decode()
    assert "No inbox event produced this item" in empty
