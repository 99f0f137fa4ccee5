"""A database error that passes never fails an event (issue 28 item 2): a full disk, a
read-only database and a server out of connections stop the drain with one clear line, and
every inbox row stays as it was, to route once the database takes writes again. Real
databases, real `manage.py` processes: a SQLite file on a small tmpfs that is filled up, a
PostgreSQL database set read-only, and a role the server admits no connection for."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage
from tests.routing.helpers import generic_event

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs of our own (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the disk-full test is skipped")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); skipped")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    return filler


def _states(database: Path) -> dict[str, int]:
    with sqlite3.connect(database) as db:
        return dict(
            db.execute(
                "SELECT state, COUNT(*) FROM routing_inbox_events GROUP BY state"
            ).fetchall()
        )


@pytest.mark.sqlite
def test_a_full_disk_stops_the_drain_and_fails_no_event(
    small_disk: Path, tmp_path: Path, migrated_sqlite: Callable[[Path], Path]
) -> None:
    database = migrated_sqlite(small_disk / "loopsweb.sqlite3")
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{database}",
        "LOOPSWEB_DATA_DIR": str(small_disk / "data"),
    }
    env.pop("SQLITE_TEST_NAME", None)
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(json.dumps(generic_event()) for _ in range(40)) + "\n")
    manage(env, "ingest_events", str(events), timeout=180)
    with sqlite3.connect(database) as db:  # no WAL room left to write into
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    filler = _fill(small_disk)

    drained = manage(
        env,
        "drain",
        "generic",
        "--max-dispatch",
        "40",
        "--max-active",
        "100",
        check=False,
        timeout=180,
    )
    assert drained.returncode == 1, drained.stdout
    assert "Traceback" not in drained.stderr, drained.stderr
    assert "database refuses writes" in drained.stderr, drained.stderr
    assert "disk is full" in drained.stderr
    assert _states(database) == {"pending": 40}  # not one event failed

    filler.unlink()  # space again: every event routes
    manage(
        env,
        "drain",
        "generic",
        "--max-dispatch",
        "40",
        "--max-active",
        "100",
        timeout=180,
    )
    assert _states(database) == {"admitted": 40}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_read_only_database_stops_the_drain_and_fails_no_event() -> None:
    inbox_ingest(enumerate([generic_event() for _ in range(5)], start=1))
    name = connection.settings_dict["NAME"]
    env = {**os.environ, "DATABASE_URL": child_database_url()}
    with connection.cursor() as cursor:
        cursor.execute(
            f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'
        )
    try:
        drained = manage(
            env, "drain", "generic", "--max-dispatch", "5", check=False, timeout=180
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                f'ALTER DATABASE "{name}" RESET default_transaction_read_only'
            )
    assert drained.returncode == 1, drained.stdout
    assert "Traceback" not in drained.stderr, drained.stderr
    assert "database refuses writes" in drained.stderr, drained.stderr
    assert set(InboxEvent.objects.values_list("state", flat=True)) == {"pending"}
    manage(env, "drain", "generic", "--max-dispatch", "5", timeout=180)
    assert set(InboxEvent.objects.values_list("state", flat=True)) == {"admitted"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_too_many_connections_is_one_line_and_touches_nothing() -> None:
    """The suite's private server admits no connection for a role at its limit (the
    server's own "too many connections" error, SQLSTATE 53300)."""
    inbox_ingest(enumerate([generic_event() for _ in range(3)], start=1))
    role = f"lw_busy_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    try:
        url = child_database_url().replace(
            "postgres://postgres@", f"postgres://{role}@"
        )
        drained = manage(
            {**os.environ, "DATABASE_URL": url},
            "drain",
            "generic",
            "--max-dispatch",
            "3",
            check=False,
            timeout=180,
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP ROLE {role}")
    assert drained.returncode == 1
    assert "Traceback" not in drained.stderr, drained.stderr
    assert "too many connections" in drained.stderr, drained.stderr
    assert set(InboxEvent.objects.values_list("state", flat=True)) == {"pending"}
