"""Writes the database refuses for now (issue 28 item 2): real errors from real databases are
classified as passing and as `writes_refused`, never as the row's own error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from django.db import DatabaseError, connection, connections, transaction

from ledger.dberrors import connection_lost, error_passes, writes_refused

pytestmark = pytest.mark.django_db


@pytest.mark.sqlite
def test_a_read_only_sqlite_file_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "ro.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (v INTEGER)")
    settings = {**connection.settings_dict, "NAME": f"file:{path}?mode=ro"}
    settings["OPTIONS"] = {**settings.get("OPTIONS", {}), "uri": True}
    ro = connections.create_connection("default")
    ro.settings_dict = settings
    try:
        with pytest.raises(DatabaseError) as caught:
            with ro.cursor() as cursor:
                cursor.execute("INSERT INTO t VALUES (1)")
    finally:
        ro.close()
    assert "readonly database" in str(caught.value)
    assert writes_refused(caught.value) and error_passes(caught.value)
    assert not connection_lost(caught.value)


@pytest.mark.postgres
def test_a_read_only_postgresql_transaction_refuses_writes() -> None:
    with pytest.raises(DatabaseError) as caught:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION READ ONLY")
            cursor.execute("CREATE TEMP TABLE t (v int)")
    assert writes_refused(caught.value) and error_passes(caught.value)
    assert not connection_lost(caught.value)


@pytest.mark.postgres
def test_a_unique_violation_is_the_rows_own_error() -> None:
    with pytest.raises(DatabaseError) as caught:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE u (v int UNIQUE)")
            cursor.execute("INSERT INTO u VALUES (1), (1)")
    assert not writes_refused(caught.value) and not error_passes(caught.value)
