"""`manage.py routes` (upstream `loops routes list|show|requeue|invocations`, docs/upstream.md §2.1)."""

from __future__ import annotations

import io
import json
import os
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from ledger import services
from ledger.models import RunStatus, WorkflowWorkItem, WorkItemStatus
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage
from tests.routing.helpers import generic_event, route

pytestmark = pytest.mark.django_db


def _routes(*argv: str) -> Any:
    out = io.StringIO()
    call_command("routes", *argv, "--json", stdout=out)
    return json.loads(out.getvalue())


def _items(n: int) -> list[WorkflowWorkItem]:
    items = []
    for i in range(n):
        result = route(event=generic_event(project=f"/srv/r{i}"))
        assert result.work_item is not None
        items.append(result.work_item)
    return items


def test_list_orders_as_upstream_and_filters() -> None:
    items = _items(3)
    base = timezone.now() - timedelta(hours=1)
    for i, item in enumerate(items):
        WorkflowWorkItem.objects.filter(pk=item.pk).update(
            created_at=base + timedelta(minutes=i), priority=1 if i == 2 else 0
        )
    ids = [i.id for i in items]
    # No status filter: newest first.
    assert [r["id"] for r in _routes("list")] == ids[::-1]
    # With a status: priority DESC, then oldest first.
    assert [r["id"] for r in _routes("list", "--status", "admitted")] == [
        ids[2],
        ids[0],
        ids[1],
    ]
    assert _routes("list", "--status", "failed") == []
    assert [r["id"] for r in _routes("list", "--limit", "1")] == [ids[2]]
    assert len(_routes("list", "--route-key", "generic-event")) == 3
    assert _routes("list", "--route-key", "todos-task") == []
    with pytest.raises(CommandError, match="--limit must be a whole number"):
        call_command("routes", "list", "--limit", "0", stdout=io.StringIO())


def test_show_has_the_item_its_invocation_workflow_loop_and_attempts() -> None:
    result = route(event=generic_event(), max_attempts="2", retry_backoff="0")
    item = result.work_item
    assert item is not None and result.run is not None
    services.run_claim(run_id=result.run.id, worker="w:1")
    services.run_finalize(run_id=result.run.id, status=RunStatus.FAILED, error="boom")
    shown = _routes("show", item.id)
    assert shown["workItem"]["id"] == item.id
    assert shown["workItem"]["lastReason"] == "attempt failed; retry pending: boom"
    assert shown["invocation"]["id"] == item.invocation_id
    assert shown["workflow"]["id"] == item.workflow_id
    assert shown["loop"]["maxAttempts"] == 2
    assert [(r["attempt"], r["status"], r["error"]) for r in shown["runs"]] == [
        (1, "failed", "boom"),
        (2, "queued", None),
    ]
    with pytest.raises(CommandError) as err:
        call_command("routes", "show", "missing", stdout=io.StringIO())
    assert str(err.value) == "route work item not found: missing"


def test_requeue_requires_a_reason_and_keeps_attempts() -> None:
    (item,) = _items(1)
    with pytest.raises(CommandError) as err:
        call_command("routes", "requeue", item.id, stdout=io.StringIO())
    assert str(err.value) == "routes requeue requires --reason <text>"
    with pytest.raises(CommandError) as err:
        call_command(
            "routes", "requeue", item.id, "--reason", "x", stdout=io.StringIO()
        )
    assert str(err.value) == (
        f"workflow work item is not requeueable: {item.id} status=admitted"
    )
    with pytest.raises(CommandError) as err:
        call_command("routes", "requeue", "nope", "--reason", "x", stdout=io.StringIO())
    assert str(err.value) == "workflow work item not found: nope"

    services.work_item_cancel(item_id=item.id, reason="stop")
    dry = _routes("requeue", item.id, "--reason", "try again", "--dry-run")
    assert dry["wouldRequeue"] is True
    assert WorkflowWorkItem.objects.get(pk=item.pk).status == WorkItemStatus.CANCELLED
    done = _routes("requeue", item.id, "--reason", "try again")
    assert done["status"] == "queued" and done["lastReason"] == "try again"
    assert done["attempts"] == 1 and done["workflowRunId"] is None


def test_invocations_lists_newest_first() -> None:
    items = _items(2)
    rows = _routes("invocations", "--limit", "5")
    assert [r["id"] for r in rows] == [items[1].invocation_id, items[0].invocation_id]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_routes_runs_as_a_process_and_refuses_a_requeue_without_reason() -> None:
    (item,) = _items(1)
    env = {**os.environ, "DATABASE_URL": child_database_url(), "LOOPSWEB_TESTING": "1"}
    refused = manage(env, "routes", "requeue", item.id, check=False)
    assert refused.returncode != 0
    assert "routes requeue requires --reason <text>" in refused.stderr
    listed = manage(env, "routes", "list", "--status", "admitted", "--json")
    assert [r["id"] for r in json.loads(listed.stdout)] == [item.id]
