"""The ledger's release history: 0001 (before route scoping) and 0002 (route scoping)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)


def _migrate(target: str) -> None:
    call_command("migrate", "ledger", target, verbosity=0, stdout=io.StringIO())


def _columns(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return {
            c.name
            for c in connection.introspection.get_table_description(cursor, table)
        }


def _indexes(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, table))


def _tables() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


def _insert_old_rows() -> None:
    """Rows written the way the previous release (0001) wrote them: no route_scope column."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO workflow_invocations (id, source_kind, source_id, source_dedupe_key, source_json,"
            " subject_kind, subject_json, intent, created_at, updated_at)"
            " VALUES ('0000000000010000000000000000000a', 'event', 'e1', 'k1', '{}', 'event', '{}', 'route',"
            " %s, %s)",
            ["2026-07-05 12:00:00+00:00", "2026-07-05 12:00:00+00:00"],
        )
        cursor.execute(
            "INSERT INTO workflow_work_items (id, route_key, idempotency_key, invocation_id, source_type,"
            " source_ref, subject_ref, project_key, project_group, priority, status, attempts, created_at,"
            " updated_at) VALUES ('0000000000010000000000000000000b', 'todos-task', 'todos-task:t1',"
            " '0000000000010000000000000000000a', 'task.created', 'e1', 't1', '/repo', 'g', 0, 'running', 1,"
            " %s, %s)",
            ["2026-07-05 12:00:00+00:00", "2026-07-05 12:00:00+00:00"],
        )


def _old_row() -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, route_key, idempotency_key, invocation_id, project_key, project_group, status, attempts"
            " FROM workflow_work_items ORDER BY id"
        )
        return tuple(cursor.fetchall())


@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_migrations_round_trip_zero_latest_zero_latest_keeping_rows_across_the_scope_migration() -> (
    None
):
    _migrate("zero")
    assert "workflow_work_items" not in _tables()
    _migrate("0001")
    assert "route_scope" not in _columns("workflow_work_items")
    assert "idx_workflow_work_items_scope" not in _indexes("workflow_work_items")
    _insert_old_rows()
    before = _old_row()

    _migrate("0002")
    assert "route_scope" in _columns("workflow_work_items")
    assert "idx_workflow_work_items_scope" in _indexes("workflow_work_items")
    assert _old_row() == before
    with connection.cursor() as cursor:
        cursor.execute("SELECT route_scope FROM workflow_work_items")
        assert cursor.fetchall() == [(None,)]

    _migrate("0001")
    assert "route_scope" not in _columns("workflow_work_items")
    assert "idx_workflow_work_items_scope" not in _indexes("workflow_work_items")
    assert _old_row() == before

    _migrate("zero")
    assert not {"workflow_work_items", "workflow_runs", "loops"} & _tables()
    call_command("migrate", verbosity=0, stdout=io.StringIO())
    assert "route_scope" in _columns("workflow_work_items")
    assert _old_row() == ()


def test_no_model_change_lacks_a_migration() -> None:
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
