from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from ledger.ids import id_timestamp_ms, new_id
from ledger.models import WorkflowSpec, WorkflowWorkItem
from tests.factories import (
    make_invocation,
    make_run,
    make_spec,
    make_step_run,
    make_work_item,
)

pytestmark = pytest.mark.django_db


def test_ids_are_32_hex_and_sort_by_creation_time() -> None:
    first, second = new_id(now_ms=1_000), new_id(now_ms=2_000)
    assert len(first) == 32 and int(first, 16) >= 0
    assert first < second
    assert id_timestamp_ms(second) == 2_000


def test_a_second_item_with_the_same_route_and_idempotency_key_is_refused() -> None:
    item = make_work_item(route_key="todos-task", idempotency_key="todos-task:t1")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_work_item(
            route_key="todos-task",
            idempotency_key="todos-task:t1",
            invocation=item.invocation,
        )
    # The same key on another route is a different item.
    make_work_item(
        route_key="generic-event",
        idempotency_key="todos-task:t1",
        invocation=item.invocation,
    )
    assert WorkflowWorkItem.objects.filter(idempotency_key="todos-task:t1").count() == 2


def test_invocation_dedupe_keys_are_unique_per_source_kind_but_null_keys_repeat() -> (
    None
):
    make_invocation(source_kind="event", source_dedupe_key="k1")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_invocation(source_kind="event", source_dedupe_key="k1")
    make_invocation(source_kind="manual", source_dedupe_key="k1")
    make_invocation(source_kind="event", source_dedupe_key=None)
    make_invocation(source_kind="event", source_dedupe_key=None)


def test_only_one_active_spec_per_name_but_archived_ones_may_share_it() -> None:
    make_spec(name="w", status="active")
    make_spec(name="w", status="archived")
    make_spec(name="w", status="archived")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_spec(name="w", status="active")
    assert WorkflowSpec.objects.filter(name="w").count() == 3


def test_step_ids_are_unique_within_a_run() -> None:
    run = make_run()
    make_step_run(workflow_run=run, step_id="worker")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_step_run(workflow_run=run, step_id="worker")
    make_step_run(workflow_run=make_run(), step_id="worker")


def test_run_idempotency_keys_are_unique_per_workflow() -> None:
    spec = make_spec()
    make_run(workflow=spec, idempotency_key="once")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_run(workflow=spec, idempotency_key="once")
    make_run(workflow=spec, idempotency_key=None)
    make_run(workflow=spec, idempotency_key=None)


def test_upstream_table_and_column_names_are_kept() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
        columns = {
            c.name
            for c in connection.introspection.get_table_description(
                cursor, "workflow_step_runs"
            )
        }
        item_columns = {
            c.name
            for c in connection.introspection.get_table_description(
                cursor, "workflow_work_items"
            )
        }
    assert {
        "workflow_invocations",
        "workflow_work_items",
        "workflow_specs",
        "workflow_runs",
        "workflow_step_runs",
        "workflow_events",
        "loops",
        "loop_runs",
    } <= tables
    assert {
        "account_profile",
        "account_tool",
        "workflow_run_id",
        "step_id",
        "sequence",
    } <= columns
    assert {
        "route_scope",
        "route_key",
        "idempotency_key",
        "project_key",
        "project_group",
        "invocation_id",
    } <= item_columns
