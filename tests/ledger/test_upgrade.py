"""Upgrading a real pre-route-scope ledger (the committed fixtures), on SQLite and PostgreSQL.

The fixture is a database the previous release left behind: `ledger` 0001 applied, contrib
apps and django_q migrated, `routing` absent (tests/fixtures/build_pre_route_scope_fixture.py).
Each backend's suite loads its own fixture (the SQLite file, or the pg_dump SQL into a fresh
PostgreSQL database next to the test database) and runs `manage.py migrate` in a subprocess
with DATABASE_URL pointing at the copy: the same path an operator takes.

The tests read the copies with sqlite3 / psycopg directly rather than through Django, so what
they compare is what the database stores.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.ledger.upgrade_probe import ALPHA, OLD_CODE_ITEM, QUEUED_ITEM, WEB
from tests.processes import scratch_cwd
from tests.waiting import hang_deadline, wait_for

ROOT = Path(__file__).resolve().parents[2]
MANAGE_PY = str(ROOT / "manage.py")
FIXTURES = ROOT / "tests" / "fixtures"
SQLITE_FIXTURE = FIXTURES / "pre_route_scope.sqlite3"
PG_FIXTURE = FIXTURES / "pre_route_scope.pg.sql"

# The ledger tables of the previous release (ledger 0001), compared row for row.
OLD_LEDGER_TABLES = (
    "loops",
    "loop_runs",
    "workflow_invocations",
    "workflow_specs",
    "workflow_runs",
    "workflow_step_runs",
    "workflow_events",
    "workflow_work_items",
)
SCOPE_INDEX = "idx_workflow_work_items_scope"
WORK_ITEMS = "workflow_work_items"
ACTIVE_SQL = "status IN ('admitted', 'running')"

# Every test migrates copies in `manage.py` subprocesses. One worker runs them all, so the
# module's upgraded copy is built once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("upgrade")]


# --- the two backends behind one small interface -----------------------------------------------


class Db(Protocol):
    vendor: str
    url: str

    def query(
        self, sql: str, params: tuple[Any, ...] = ()
    ) -> list[tuple[Any, ...]]: ...
    def tables(self) -> set[str]: ...
    def columns(self, table: str) -> list[tuple[Any, ...]]: ...
    def indexes(self, table: str) -> dict[str, str]: ...
    def storage_id(self, table: str) -> int: ...
    def row_images(self, table: str, columns: list[str]) -> list[tuple[Any, ...]]: ...


@dataclass
class SqliteDb:
    path: Path
    vendor: str = "sqlite"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        # A short-lived connection per call: nothing of ours holds a lock while manage.py runs.
        con = sqlite3.connect(self.path)
        try:
            return con.execute(sql.replace("%s", "?"), params).fetchall()
        finally:
            con.close()

    def tables(self) -> set[str]:
        return {
            r[0]
            for r in self.query(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        }

    def columns(self, table: str) -> list[tuple[Any, ...]]:
        # (cid, name, type, notnull, default, pk): position, type and nullability included.
        return self.query(f'PRAGMA table_info("{table}")')

    def indexes(self, table: str) -> dict[str, str]:
        return dict(
            self.query(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s",
                (table,),
            )
        )

    def storage_id(self, table: str) -> int:
        # A table rebuild (CREATE new__t, copy, DROP, RENAME) gives the table a new root page.
        return self.query(
            "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = %s",
            (table,),
        )[0][0]

    def row_images(self, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
        # quote() renders each stored value as an SQL literal: type and bytes, not a Python
        # conversion of them ('1' and 1 differ, as do two encodings of the same text).
        cols = ", ".join(f'quote("{c}")' for c in columns)
        return sorted(self.query(f'SELECT {cols} FROM "{table}"'))

    def copy(self, dest: Path) -> SqliteDb:
        src, dst = sqlite3.connect(self.path), sqlite3.connect(dest)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        return SqliteDb(dest)


@dataclass
class PgDb:
    server: str  # any database URL on the server; only host, port and user are used
    name: str
    vendor: str = "postgresql"

    @property
    def url(self) -> str:
        return urlunsplit(urlsplit(self.server)._replace(path=f"/{self.name}"))

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.connect() as con:
            cur = con.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def tables(self) -> set[str]:
        return {
            r[0]
            for r in self.query(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            )
        }

    def columns(self, table: str) -> list[tuple[Any, ...]]:
        return self.query(
            "SELECT ordinal_position, column_name, data_type, character_maximum_length,"
            " is_nullable, column_default FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
            (table,),
        )

    def indexes(self, table: str) -> dict[str, str]:
        return dict(
            self.query(
                "SELECT indexname, indexdef FROM pg_indexes"
                " WHERE schemaname = 'public' AND tablename = %s",
                (table,),
            )
        )

    def storage_id(self, table: str) -> int:
        # Any rewrite of the table (ALTER ... TYPE, ADD COLUMN with a volatile default,
        # VACUUM FULL) writes a new relfilenode; a metadata-only change keeps it.
        return self.query("SELECT pg_relation_filenode(%s::regclass)", (table,))[0][0]

    def row_images(self, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
        # Each value as PostgreSQL's text output: what is stored, not a Python conversion.
        cols = ", ".join(f'"{c}"::text' for c in columns)
        return sorted(self.query(f'SELECT {cols} FROM "{table}"'), key=repr)

    def _admin(self, sql: str) -> None:
        import psycopg

        admin = PgDb(self.server, "postgres")

        # CREATE DATABASE ... TEMPLATE fails while anything (autovacuum included) is connected
        # to the template; that clears within moments, so retry until it does.
        def done() -> bool:
            try:
                admin.query(sql)
            except psycopg.errors.ObjectInUse:
                return False
            return True

        wait_for(done, interval=0.2, what=f"{sql} (its template database in use)")

    def create(self, *, template: PgDb | None = None) -> PgDb:
        self.drop()
        tail = f' TEMPLATE "{template.name}"' if template else ""
        self._admin(f'CREATE DATABASE "{self.name}"{tail}')
        return self

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def load(self, sql_file: Path) -> PgDb:
        # The dump is plain SQL with INSERTs (no COPY FROM stdin, no psql meta-commands), so it
        # runs as one simple-protocol script.
        with self.connect() as con:
            con.execute(sql_file.read_text(encoding="utf-8"))
        return self


def _vendor() -> str:
    from django.db import connection

    return connection.vendor


def _pg_server_and_prefix() -> tuple[str, str]:
    # Our databases sit beside the suite's: same server, names derived from DATABASE_URL's
    # database name and the xdist worker (h7 -> h7_gw1_upg_*), so parallel suites on one
    # server, and the workers of one suite, do not collide.
    url = os.environ.get(
        "DATABASE_URL", ""
    )  # unset on SQLite, where only files are used
    name = urlsplit(url).path.lstrip("/") or "loopsweb"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return url, f"{name}_{worker}_upg" if worker else f"{name}_upg"


def manage(
    db: Db, *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run manage.py against `db` in a fresh process, as an operator would; must succeed."""
    proc = subprocess.run(
        [sys.executable, MANAGE_PY, *args],
        cwd=scratch_cwd(),
        env=_env(db),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"manage.py {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def _env(db: Db) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": db.url,
        "DJANGO_SETTINGS_MODULE": "loopsweb.settings",
        "PYTHONPATH": str(ROOT),  # `python -c` imports the project from another cwd
    }


# --- snapshots ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    columns: dict[str, list[tuple[Any, ...]]]
    rows: dict[str, list[tuple[Any, ...]]]

    @staticmethod
    def take(db: Db) -> Snapshot:
        columns = {t: db.columns(t) for t in sorted(db.tables())}
        rows = {t: db.row_images(t, _names(cols)) for t, cols in columns.items()}
        return Snapshot(columns, rows)

    def old_columns_now(self, db: Db, table: str) -> list[tuple[Any, ...]]:
        names = set(_names(self.columns[table]))
        return [c for c in db.columns(table) if _name(c) in names]

    def old_rows_now(self, db: Db, table: str) -> list[tuple[Any, ...]]:
        return db.row_images(table, _names(self.columns[table]))


def _name(column: tuple[Any, ...]) -> str:
    return column[1]  # the name is the second field on both backends


def _names(columns: list[tuple[Any, ...]]) -> list[str]:
    return [_name(c) for c in columns]


def assert_old_data_unchanged(before: Snapshot, db: Db) -> None:
    """Every pre-existing row, in every old column, is stored exactly as before."""
    for table in OLD_LEDGER_TABLES:
        assert before.rows[table], f"the fixture has rows in {table}"
        assert before.old_columns_now(db, table) == before.columns[table], table
        assert before.old_rows_now(db, table) == before.rows[table], table
    # Other tables (contrib, django_q, django_migrations) may gain rows, never lose or change one.
    for table in sorted(set(before.rows) - set(OLD_LEDGER_TABLES)):
        lost = Counter(before.rows[table]) - Counter(before.old_rows_now(db, table))
        assert not lost, f"{table}: rows changed or lost: {list(lost)[:3]}"


def applied(db: Db, app: str) -> set[str]:
    return {
        r[0]
        for r in db.query("SELECT name FROM django_migrations WHERE app = %s", (app,))
    }


# --- fixtures -----------------------------------------------------------------------------------


@dataclass
class Upgrade:
    pristine: Db  # the committed fixture, loaded and untouched
    db: Db  # the same, migrated to the latest migrations
    before: Snapshot
    storage_before: int
    storage_after_0002: int
    index_at_0002: str
    migrate_out: str


class Copies:
    """Fresh copies of a database for tests that write; dropped at teardown."""

    def __init__(self, tmp: Path, prefix: str) -> None:
        self.tmp, self.prefix = tmp, prefix
        self.made: list[Db] = []

    def of(self, source: Db, label: str) -> Db:
        if isinstance(source, SqliteDb):
            copy: Db = source.copy(self.tmp / f"{label}.sqlite3")
        else:
            assert isinstance(source, PgDb)
            copy = PgDb(source.server, f"{self.prefix}_{label}").create(template=source)
        self.made.append(copy)
        return copy

    def fixture(self, label: str) -> Db:
        """The committed fixture, freshly loaded."""
        if _vendor() == "sqlite":
            path = self.tmp / f"{label}.sqlite3"
            shutil.copyfile(SQLITE_FIXTURE, path)
            db: Db = SqliteDb(path)
        else:
            server = _pg_server_and_prefix()[0]
            db = PgDb(server, f"{self.prefix}_{label}").create().load(PG_FIXTURE)
        self.made.append(db)
        return db

    def drop_all(self) -> None:
        for db in self.made:
            if isinstance(db, PgDb):
                db.drop()


@pytest.fixture(scope="module")
def module_copies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Copies]:
    copies = Copies(tmp_path_factory.mktemp("upgrade"), _pg_server_and_prefix()[1])
    yield copies
    copies.drop_all()


@pytest.fixture
def copies(tmp_path: Path) -> Iterator[Copies]:
    copies = Copies(tmp_path, _pg_server_and_prefix()[1] + "_t")
    yield copies
    copies.drop_all()


@pytest.fixture(scope="module")
def upgraded(module_copies: Copies) -> Upgrade:
    """The fixture migrated in two steps: to ledger 0002 (route scoping), then to the latest."""
    db = module_copies.fixture("main")
    pristine = module_copies.of(db, "pristine")
    before = Snapshot.take(db)
    storage_before = db.storage_id(WORK_ITEMS)
    manage(db, "migrate", "--noinput", "ledger", "0002")
    storage_after_0002 = db.storage_id(WORK_ITEMS)
    index_at_0002 = db.indexes(WORK_ITEMS)[SCOPE_INDEX]
    out = manage(db, "migrate", "--noinput").stdout
    return Upgrade(
        pristine, db, before, storage_before, storage_after_0002, index_at_0002, out
    )


# --- tests --------------------------------------------------------------------------------------


def test_committed_fixture_is_a_pre_route_scope_ledger_with_representative_rows(
    upgraded: Upgrade,
) -> None:
    from ledger.models import WorkItemStatus

    db = upgraded.pristine
    assert applied(db, "ledger") == {"0001_initial"}
    assert applied(db, "routing") == set()
    for app in ("contenttypes", "auth", "admin", "sessions", "django_q"):
        assert applied(db, app), f"{app} was migrated in the previous release"
    assert "route_scope" not in _names(db.columns(WORK_ITEMS))
    assert SCOPE_INDEX not in db.indexes(WORK_ITEMS)
    statuses = {r[0] for r in db.query(f"SELECT DISTINCT status FROM {WORK_ITEMS}")}
    # Every status the fixture's release knew; `needs_human` came later (0028).
    assert statuses == set(WorkItemStatus.values) - {WorkItemStatus.NEEDS_HUMAN}
    (with_account, without_account) = db.query(
        "SELECT count(account_profile), count(*) - count(account_profile) FROM workflow_step_runs"
    )[0]
    assert with_account > 0 and without_account > 0
    (keys, groups, no_key) = db.query(
        f"SELECT count(DISTINCT project_key), count(DISTINCT project_group),"
        f" count(*) - count(project_key) FROM {WORK_ITEMS}"
    )[0]
    assert keys >= 2 and groups >= 2 and no_key >= 1
    for table in OLD_LEDGER_TABLES:
        assert db.query(f"SELECT count(*) FROM {table}")[0][0] > 0, table


def test_upgrade_adds_the_nullable_scope_column_and_index_and_keeps_every_old_row(
    upgraded: Upgrade,
) -> None:
    db = upgraded.db
    assert "route_scope" in _names(db.columns(WORK_ITEMS))
    assert db.query(
        f"SELECT count(*) FROM {WORK_ITEMS} WHERE route_scope IS NOT NULL"
    ) == [(0,)]
    index = db.indexes(WORK_ITEMS)[SCOPE_INDEX]
    assert '"route_scope", "status"' in index or "(route_scope, status)" in index
    assert {"0001_initial", "0002_work_item_route_scope"} <= applied(db, "ledger")
    assert "0001_initial" in applied(db, "routing")
    assert_old_data_unchanged(upgraded.before, db)


def test_upgrade_fills_the_account_loads_from_the_rows(upgraded: Upgrade) -> None:
    """ledger 0004 counts the running and reserved steps the old rows already carry."""
    loads = upgraded.db.query(
        "SELECT account_profile, running, reserved FROM workflow_account_loads"
    )
    assert sum(row[1] + row[2] for row in loads) > 0  # the fixture has running work
    report = json.loads(
        manage(upgraded.db, "recount_account_loads", "--dry-run", "--json").stdout
    )
    assert report["drift"] == []


def test_migrating_the_upgraded_ledger_again_changes_nothing(upgraded: Upgrade) -> None:
    db = upgraded.db
    rows_before = Snapshot.take(db)
    out = manage(db, "migrate", "--noinput").stdout
    assert "No migrations to apply." in out
    assert Snapshot.take(db) == rows_before


def test_adding_the_scope_column_does_not_rebuild_or_rewrite_the_table(
    upgraded: Upgrade,
) -> None:
    # SQLite: ALTER TABLE ADD COLUMN keeps the root page (a rebuild would move it).
    # PostgreSQL: a nullable column without default is a catalog change; the relfilenode stays.
    assert upgraded.storage_after_0002 == upgraded.storage_before


@pytest.mark.sqlite
def test_sqlite_gets_a_plain_scope_index(upgraded: Upgrade) -> None:
    assert upgraded.index_at_0002 == (
        'CREATE INDEX "idx_workflow_work_items_scope" ON "workflow_work_items" '
        '("route_scope", "status")'
    )


@pytest.mark.postgres
def test_postgres_scope_index_is_valid_after_the_concurrent_build(
    upgraded: Upgrade,
) -> None:
    db = upgraded.db
    assert upgraded.index_at_0002.startswith(
        "CREATE INDEX idx_workflow_work_items_scope"
    )
    assert db.query(
        "SELECT i.indisvalid, i.indisready FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
        (SCOPE_INDEX,),
    ) == [(True, True)]


def test_reversing_to_ledger_0001_drops_the_column_and_index_and_keeps_the_data(
    upgraded: Upgrade, copies: Copies
) -> None:
    from django.apps import apps

    db = copies.of(upgraded.db, "reverse")
    manage(db, "migrate", "--noinput", "ledger", "0001")
    assert "route_scope" not in _names(db.columns(WORK_ITEMS))
    assert SCOPE_INDEX not in db.indexes(WORK_ITEMS)
    assert applied(db, "ledger") == {"0001_initial"}
    # routing depends on ledger 0003, so it is unapplied with it: its tables go too.
    assert applied(db, "routing") == set()
    ours = {
        m._meta.db_table
        for label in ("ledger", "routing")
        for m in apps.get_app_config(label).get_models()
    }
    pristine_tables = upgraded.pristine.tables()
    assert (ours - pristine_tables) & db.tables() == set()
    assert pristine_tables <= db.tables()
    assert_old_data_unchanged(upgraded.before, db)


def test_previous_release_code_reads_and_writes_the_upgraded_ledger_and_null_scope_rows_skip_scoped_caps(
    upgraded: Upgrade, copies: Copies
) -> None:
    db = copies.of(upgraded.db, "rollback")
    active_alpha = db.query(
        f"SELECT count(*) FROM {WORK_ITEMS} WHERE {ACTIVE_SQL} AND project_key = %s",
        (ALPHA,),
    )[0][0]
    active_web = db.query(
        f"SELECT count(*) FROM {WORK_ITEMS} WHERE {ACTIVE_SQL} AND project_group = %s",
        (WEB,),
    )[0][0]
    active_all = db.query(f"SELECT count(*) FROM {WORK_ITEMS} WHERE {ACTIVE_SQL}")[0][0]
    assert active_alpha and active_web, (
        "the fixture has active NULL-scope alpha/web items"
    )
    items_before = db.query(f"SELECT id, status FROM {WORK_ITEMS} ORDER BY id")

    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.ledger.upgrade_probe import rollback_probe; rollback_probe()",
        ],
        cwd=scratch_cwd(),
        env=_env(db),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    assert "route_scope" not in out["old_columns"]
    assert [tuple(r) for r in out["old_read"]] == items_before
    assert [tuple(r) for r in out["old_read_back"]] == [
        (QUEUED_ITEM, "deferred", "deferred by the previous release"),
        (OLD_CODE_ITEM, "running", None),
    ]
    assert out["new_count"] == len(items_before) + 1
    assert out["new_reads_old_row_scope"] is None
    assert db.query(
        f"SELECT route_scope FROM {WORK_ITEMS} WHERE id IN (%s, %s)",
        (OLD_CODE_ITEM, QUEUED_ITEM),
    ) == [(None,), (None,)]
    # NULL-scope active rows (old ones and the one old code just wrote) count toward the
    # project and group caps, and toward the unscoped total, but never toward a scope.
    assert out["scoped"] == {
        "scope": 0,
        "project": active_alpha + 1,
        "project_group": active_web + 1,
    }
    assert out["unscoped"]["scope"] == active_all + 1
    assert out["scoped_after_new"] == {
        "scope": 1,
        "project": active_alpha + 2,
        "project_group": active_web + 2,
    }


@pytest.mark.postgres
def test_scope_index_builds_concurrently_while_other_connections_keep_writing(
    copies: Copies,
) -> None:
    """While CREATE INDEX CONCURRENTLY is in progress, inserts and updates complete.

    An open REPEATABLE READ transaction (a snapshot older than the build) holds the build in
    its last phase, "waiting for old snapshots", with the index present but not yet valid.
    A plain CREATE INDEX would not wait there (and would block the writes instead).
    """
    db = copies.fixture("cic")
    assert isinstance(db, PgDb)
    relfilenode = db.storage_id(WORK_ITEMS)
    holder = db.connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")  # takes the snapshot; touches no ledger table
    migrate = subprocess.Popen(
        [sys.executable, MANAGE_PY, "migrate", "--noinput", "ledger", "0002"],
        cwd=scratch_cwd(),
        env=_env(db),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        progress = wait_for(
            lambda: db.query(
                "SELECT command, phase FROM pg_stat_progress_create_index"
                " WHERE relid = %s::regclass AND phase = 'waiting for old snapshots'",
                (WORK_ITEMS,),
            ),
            timeout=60,
            what="the index build to wait for the old snapshot",
        )
        assert progress == [("CREATE INDEX CONCURRENTLY", "waiting for old snapshots")]

        with db.connect() as writer:
            # Fail instead of hanging if anything did block the writes (a blocked write
            # would wait for the holder's snapshot, which is never released here).
            writer.execute(f"SET lock_timeout = '{hang_deadline(60):.0f}s'")
            writer.execute(
                "INSERT INTO workflow_invocations (id, source_kind, source_json, subject_kind,"
                " subject_json, intent, created_at, updated_at) VALUES"
                " ('0190ee00000000000000000000000001', 'event', '{}', 'event', '{}', 'route',"
                " now(), now())"
            )
            writer.execute(
                f"INSERT INTO {WORK_ITEMS} (id, route_key, idempotency_key, invocation_id,"
                " source_type, source_ref, subject_ref, priority, status, attempts, route_scope,"
                " created_at, updated_at) VALUES ('0190ee00000000000000000000000002',"
                " 'todos-task', 'during-build', '0190ee00000000000000000000000001', 'x', 'x',"
                " 'x', 0, 'admitted', 0, 'during-build-scope', now(), now())"
            )
            updated = writer.execute(
                f"UPDATE {WORK_ITEMS} SET status = 'deferred' WHERE id = %s",
                (QUEUED_ITEM,),
            ).rowcount
        assert updated == 1
        # The writes finished while the build was still in progress.
        assert migrate.poll() is None
        assert db.query(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE c.relname = %s",
            (SCOPE_INDEX,),
        ) == [(False,)]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            migrate.wait(timeout=120)
        if migrate.poll() is None:
            migrate.kill()
    out, err = migrate.communicate()
    assert migrate.returncode == 0, out + err

    assert db.query(
        "SELECT i.indisvalid, i.indisready FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
        (SCOPE_INDEX,),
    ) == [(True, True)]
    # The row written during the build is found through the finished index.
    with db.connect() as con:
        con.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in con.execute(
                f"EXPLAIN SELECT id FROM {WORK_ITEMS} WHERE route_scope = 'during-build-scope'"
            ).fetchall()
        )
        found = con.execute(
            f"SELECT id FROM {WORK_ITEMS} WHERE route_scope = 'during-build-scope'"
        ).fetchall()
    assert SCOPE_INDEX in plan
    assert found == [("0190ee00000000000000000000000002",)]
    # Adding the column did not rewrite the table; a volatile default would have (control).
    assert db.storage_id(WORK_ITEMS) == relfilenode
    db.query(f"ALTER TABLE {WORK_ITEMS} ADD COLUMN h7_control float DEFAULT random()")
    assert db.storage_id(WORK_ITEMS) != relfilenode
