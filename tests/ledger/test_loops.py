"""Loop status actions and their cascades (docs/upstream.md §2.1): the service, the `loop` command
and the admin actions, on both databases."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from domain.errors import ApplicationError
from ledger import services
from ledger.models import (
    Loop,
    LoopStatus,
    RunStatus,
    SpecStatus,
    StepStatus,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.selectors import account_load
from tests.account_loads import assert_account_counts_match_rows
from tests.routing.helpers import generic_event, route

pytestmark = pytest.mark.django_db


def _admitted() -> tuple[WorkflowWorkItem, WorkflowRun, Loop]:
    result = route(event=generic_event(project="/srv/loops"))
    assert result.kind == "created" and result.run is not None
    assert result.work_item is not None and result.loop is not None
    return result.work_item, result.run, result.loop


def _fresh(
    item: WorkflowWorkItem, run: WorkflowRun
) -> tuple[WorkflowWorkItem, WorkflowRun]:
    return WorkflowWorkItem.objects.get(pk=item.pk), WorkflowRun.objects.get(pk=run.pk)


def test_pause_defers_the_items_cancels_the_run_and_resume_runs_them_again() -> None:
    item, run, loop = _admitted()
    services.run_claim(run_id=run.id, worker="w:1")  # item running, run running
    change = services.loop_status_change(loop_id=loop.id, action="pause")
    assert (change.from_status, change.to_status) == ("active", "paused")
    item, run = _fresh(item, run)
    assert item.status == WorkItemStatus.DEFERRED and item.last_reason == "loop paused"
    assert item.lease_expires_at is None and item.loop_id == loop.id
    assert run.status == RunStatus.CANCELLED and run.error == "loop paused"
    assert set(run.step_runs.values_list("status", flat=True)) == {StepStatus.CANCELLED}
    assert account_load().total() == {}
    assert Loop.objects.get(pk=loop.pk).status == LoopStatus.PAUSED
    # The generated spec is kept: resume runs it again.
    assert run.workflow.status == SpecStatus.ACTIVE

    change = services.loop_status_change(loop_id=loop.id, action="resume")
    item, _ = _fresh(item, run)
    assert change.to_status == "active" and change.new_runs == [item.workflow_run_id]
    assert item.status == WorkItemStatus.ADMITTED and item.last_reason == "loop resumed"
    again = WorkflowRun.objects.get(pk=item.workflow_run_id)
    assert again.status == RunStatus.QUEUED and again.loop_id == loop.id
    assert item.attempts == 1  # the same admission
    assert_account_counts_match_rows()


def test_archive_defers_with_loop_archived_and_records_where_it_came_from() -> None:
    item, run, loop = _admitted()
    services.loop_status_change(loop_id=loop.id, action="archive")
    item, run = _fresh(item, run)
    loop.refresh_from_db()
    assert (
        item.status == WorkItemStatus.DEFERRED and item.last_reason == "loop archived"
    )
    assert run.status == RunStatus.CANCELLED
    assert loop.archived_at is not None and loop.archived_from_status == "active"
    assert loop.status == LoopStatus.PAUSED
    services.loop_status_change(loop_id=loop.id, action="resume")
    loop.refresh_from_db()
    assert loop.archived_at is None and loop.status == LoopStatus.ACTIVE


def test_stop_cancels_with_loop_stopped_even_items_a_pause_parked() -> None:
    item, run, loop = _admitted()
    services.loop_status_change(loop_id=loop.id, action="pause")
    services.loop_status_change(loop_id=loop.id, action="stop")
    item, run = _fresh(item, run)
    assert (
        item.status == WorkItemStatus.CANCELLED and item.last_reason == "loop stopped"
    )
    assert Loop.objects.get(pk=loop.pk).status == LoopStatus.STOPPED
    run.workflow.refresh_from_db()
    assert run.workflow.status == SpecStatus.ARCHIVED


def test_stop_of_a_queued_run_cancels_it_and_its_item() -> None:
    item, run, loop = _admitted()
    change = services.loop_status_change(loop_id=loop.id, action="stop")
    item, run = _fresh(item, run)
    assert change.cancelled_runs == [run.id] and run.status == RunStatus.CANCELLED
    assert (
        item.status == WorkItemStatus.CANCELLED and item.last_reason == "loop stopped"
    )


def test_delete_cancels_with_loop_deleted_and_keeps_the_history() -> None:
    item, run, loop = _admitted()
    change = services.loop_status_change(loop_id=loop.id, action="delete")
    assert change.to_status is None
    item, run = _fresh(item, run)
    assert not Loop.objects.filter(pk=loop.pk).exists()
    assert (
        item.status == WorkItemStatus.CANCELLED and item.last_reason == "loop deleted"
    )
    assert item.loop_id is None and run.loop_id is None
    assert run.status == RunStatus.CANCELLED and run.error == "loop deleted"


def test_refused_actions_write_nothing_and_say_why() -> None:
    item, run, loop = _admitted()
    services.loop_status_change(loop_id=loop.id, action="stop")
    with pytest.raises(ApplicationError) as err:
        services.loop_status_change(loop_id=loop.id, action="pause")
    assert str(err.value) == f"loop cannot be paused: {loop.id} status=stopped"
    with pytest.raises(ApplicationError) as err:
        services.loop_status_change(loop_id="nope", action="stop")
    assert str(err.value) == "loop not found: nope"
    with pytest.raises(ApplicationError) as err:
        services.loop_status_change(loop_id=loop.id, action="explode")
    assert "unknown loop action: explode" in str(err.value)


def test_the_loop_command_dry_run_reports_and_writes_nothing() -> None:
    item, run, loop = _admitted()
    out = io.StringIO()
    call_command("loop", "pause", loop.id, "--dry-run", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["dryRun"] is True and report["toStatus"] == "paused"
    assert report["workItems"] == {item.id: "deferred"}
    assert report["cancelledRuns"] == [run.id]
    item, run = _fresh(item, run)
    assert item.status == WorkItemStatus.ADMITTED and run.status == RunStatus.QUEUED
    assert Loop.objects.get(pk=loop.pk).status == LoopStatus.ACTIVE

    out = io.StringIO()
    call_command("loop", "pause", loop.id, stdout=out)
    assert out.getvalue().startswith(f"loop: pause {loop.id} (")
    assert (
        "active -> paused; work items: 1 deferred; runs cancelled: 1" in out.getvalue()
    )
    with pytest.raises(CommandError, match="loop cannot be paused"):
        call_command("loop", "pause", loop.id, stdout=io.StringIO())

    out = io.StringIO()
    call_command("loop", "list", "--status", "paused", "--json", stdout=out)
    assert [row["id"] for row in json.loads(out.getvalue())] == [loop.id]


def _post(client: Any, action: str, ids: list[str], **extra: str) -> Any:
    return client.post(
        reverse("admin:ledger_loop_changelist"),
        {"action": action, "_selected_action": ids, **extra},
        follow=True,
    )


def test_admin_loop_actions_confirm_then_cascade(admin_client: Any) -> None:
    item, run, loop = _admitted()
    page = _post(admin_client, "pause_loops", [loop.id])
    body = page.content.decode()
    assert "Pause loops: 1 loop selected." in body and 'name="reason"' not in body
    assert WorkflowWorkItem.objects.get(pk=item.pk).status == WorkItemStatus.ADMITTED

    page = _post(admin_client, "pause_loops", [loop.id], confirm="yes")
    assert "Paused 1 loop." in [str(m) for m in page.context["messages"]]
    assert WorkflowWorkItem.objects.get(pk=item.pk).last_reason == "loop paused"
    page = _post(admin_client, "stop_loops", [loop.id], confirm="yes")
    assert WorkflowWorkItem.objects.get(pk=item.pk).last_reason == "loop stopped"
    page = _post(admin_client, "pause_loops", [loop.id], confirm="yes")
    messages = [str(m) for m in page.context["messages"]]
    assert any("loop cannot be paused" in m for m in messages)


def test_expire_cancels_with_loop_expired() -> None:
    item, run, loop = _admitted()
    change = services.loop_status_change(loop_id=loop.id, action="expire")
    item, run = _fresh(item, run)
    assert change.to_status == "expired"
    assert (
        item.status == WorkItemStatus.CANCELLED and item.last_reason == "loop expired"
    )
    assert run.status == RunStatus.CANCELLED and run.error == "loop expired"
