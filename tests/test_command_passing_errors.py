"""A command whose write the database does not take: one clear line, exit 1 (issue 28, 2).

Real `manage.py` processes on a real migrated SQLite file while another connection holds
its write lock (`BEGIN EXCLUSIVE`), with the busy timeout at 1 s so the lock is met at
once. A database error that passes and that a command does not handle itself ends it with
one line saying so and that the transaction was rolled back; before, each printed a
traceback ending in `database is locked`. Nothing is written, and once the lock is gone
the same command goes through.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.processes import manage, terminal_env

pytestmark = [pytest.mark.slow, pytest.mark.sqlite]


@pytest.mark.parametrize(
    ("argv", "table"),
    [
        (
            ["schedule_drain", "nightly", "generic", "--every", "5m"],
            "django_q_schedule",
        ),
        (["api_token", "create", "ci", "--scope", "ingest"], "routing_api_tokens"),
    ],
)
def test_a_write_the_locked_database_refuses_is_one_line_and_writes_nothing(
    tmp_path: Path,
    argv: list[str],
    table: str,
    migrated_sqlite: Callable[[Path], Path],
) -> None:
    data_dir = tmp_path / "data"
    db = data_dir / "loopsweb.sqlite3"
    env = terminal_env(data_dir)
    env.update(
        DATABASE_URL=f"sqlite:///{db}",
        SECRET_KEY="x" * 50,
        DJANGO_SETTINGS_MODULE="loopsweb.settings",
        SQLITE_BUSY_TIMEOUT="1",
    )
    migrated_sqlite(db)

    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        done = manage(env, *argv, check=False)
        holder.execute("ROLLBACK")
        rows = holder.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    finally:
        holder.close()

    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [
        "loopsweb: the database did not take the command (database is locked); the "
        "transaction it was in was rolled back. Run it again once the database takes "
        "writes (free space, make it writable, or wait for the server)"
    ], done.stderr
    assert rows == 0

    manage(env, *argv)  # once the lock is gone, the same command goes through
