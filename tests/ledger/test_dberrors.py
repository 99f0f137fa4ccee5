"""Which database errors pass (issue 17 #1, #5): real errors from real databases."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connections

from ledger.dberrors import connection_lost, error_passes

pytestmark = pytest.mark.django_db


@pytest.fixture
def own_connection() -> Iterator:
    """A second connection to the test database, ours to break."""
    conn = connections.create_connection("default")
    try:
        yield conn
    finally:
        try:
            conn.close()
        except DatabaseError:
            pass


def _error(conn, *statements: str) -> DatabaseError:
    with pytest.raises(DatabaseError) as caught:
        with conn.cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)
    return caught.value


@pytest.mark.postgres
def test_a_value_too_large_for_an_index_never_passes(own_connection) -> None:
    exc = _error(
        own_connection,
        "CREATE TEMP TABLE t (v text)",
        "CREATE INDEX ON t (v)",
        "INSERT INTO t SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400)",
    )
    assert "index row" in str(exc)
    assert not error_passes(exc) and not connection_lost(exc)


@pytest.mark.postgres
def test_a_statement_timeout_passes_without_losing_the_connection(
    own_connection,
) -> None:
    exc = _error(own_connection, "SET statement_timeout = 10", "SELECT pg_sleep(2)")
    assert error_passes(exc) and not connection_lost(exc)


@pytest.mark.postgres
def test_a_terminated_session_is_a_lost_connection(own_connection) -> None:
    exc = _error(own_connection, "SELECT pg_terminate_backend(pg_backend_pid())")
    assert connection_lost(exc) and error_passes(exc)
    again = _error(own_connection, "SELECT 1")
    assert connection_lost(again)


@pytest.mark.sqlite
@pytest.mark.django_db(
    transaction=True
)  # the test's own transaction would hold the lock
def test_sqlite_busy_passes_and_a_missing_table_does_not(own_connection) -> None:
    missing = _error(own_connection, "SELECT * FROM no_such_table")
    assert not error_passes(missing) and not connection_lost(missing)
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 0")
        with own_connection.cursor() as cursor:
            cursor.execute("BEGIN IMMEDIATE")
        locked = _error(other, "PRAGMA busy_timeout = 0", "BEGIN IMMEDIATE")
        assert "locked" in str(locked)
        assert error_passes(locked) and not connection_lost(locked)
    finally:
        with own_connection.cursor() as cursor:
            cursor.execute("ROLLBACK")
        other.close()
