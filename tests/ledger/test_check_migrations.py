"""`check_migrations` and `lock_migrations`: each failure kind, and a clean pass on the real tree.

The failure situations are built in a temporary copy of the project (manage.py, loopsweb/,
ledger/, routing/, migrations.lock) and checked by running the command there as a subprocess,
so the exit status and the message are what CI would see. Those tests do not touch the suite's
database (each run gets its own empty SQLite file), so they run once, in the SQLite suite.
Rule details are pinned by fast in-process tests; the database-facing part (the plan, unknown
applied migrations) runs against the suite's database on both backends.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, models
from django.db.migrations import operations as ops
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations.base import Operation
from django.db.migrations.recorder import MigrationRecorder
from django.db.migrations.state import ModelState, ProjectState

from ledger.migration_checks import (
    LockFileError,
    check_migrations,
    migration_sha256,
    read_lock,
)
from ledger.migration_rules import (
    database_operations,
    has_breaking_marker,
    irreversible_reason,
    non_additive_reasons,
)

ROOT = Path(__file__).resolve().parents[2]
RELEASED_0002 = "ledger/migrations/0002_work_item_route_scope.py"


# --- a temporary copy of the project ------------------------------------------------------------


def make_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("manage.py", "migrations.lock"):
        shutil.copy2(ROOT / name, tree / name)
    for package in ("domain", "agents", "loopsweb", "ledger", "runs", "routing"):
        shutil.copytree(
            ROOT / package,
            tree / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    return tree


def run(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tree / 'var' / 'check.sqlite3'}",
        "LOOPSWEB_DATA_DIR": str(tree / "var"),
    }
    # cwd is the copy: `python manage.py` puts it first on sys.path, ahead of the real tree.
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def ledger_leaf() -> str:
    # Others add ledger migrations too: a new one must follow whatever is the leaf today.
    return MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("ledger")[
        0
    ][1]


def add_migration(tree: Path, name: str, operations: str) -> str:
    path = f"ledger/migrations/{name}.py"
    (tree / path).write_text(
        "from django.db import migrations, models\n\n\n"
        "def forward(apps, schema_editor):\n    pass\n\n\n"
        "class Migration(migrations.Migration):\n"
        f"    dependencies = [('ledger', '{ledger_leaf()}')]\n"
        f"    operations = [{operations}]\n"
    )
    return path


def assert_fails_naming(
    proc: subprocess.CompletedProcess[str], kind: str, file: str
) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert f"ERROR [{kind}] {file}" in output, output


# --- the real tree ------------------------------------------------------------------------------


@pytest.mark.sqlite  # backend-independent (own SQLite file): run once
@pytest.mark.slow
def test_check_passes_on_the_real_tree_and_prints_the_plan() -> None:
    proc = run(ROOT, "check_migrations", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["errors"] == []
    plan = {(p["app"], p["name"]): p["applied"] for p in report["plan"]}
    # A fresh database: everything pending, our apps and the others alike.
    assert plan[("ledger", "0001_initial")] is False
    assert plan[("ledger", "0002_work_item_route_scope")] is False
    assert plan[("routing", "0001_initial")] is False
    assert ("auth", "0001_initial") in plan


@pytest.mark.django_db
def test_check_on_the_suite_database_shows_everything_applied() -> None:
    out = io.StringIO()
    call_command("check_migrations", stdout=out)
    text = out.getvalue()
    assert "[X] 0001_initial  (released)" in text
    assert "[X] 0002_work_item_route_scope  (released)" in text
    assert "[ ]" not in text
    assert "check_migrations: OK" in text


def test_the_lock_lists_ledger_0001_and_0002_with_their_current_hashes() -> None:
    entries = {e.key: e for e in read_lock(ROOT / "migrations.lock")}
    assert {"ledger/0001_initial.py", "ledger/0002_work_item_route_scope.py"} <= set(
        entries
    )
    for entry in entries.values():
        path = ROOT / entry.app / "migrations" / f"{entry.name}.py"
        assert migration_sha256(path) == entry.sha256, entry.key


# --- 1. released migrations are frozen ------------------------------------------------------------


@pytest.mark.sqlite  # backend-independent (own SQLite file): run once
@pytest.mark.slow
def test_an_edited_released_migration_fails_the_check(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    with (tree / RELEASED_0002).open("a") as f:
        f.write("# a harmless-looking edit\n")
    assert_fails_naming(run(tree, "check_migrations"), "released_edited", RELEASED_0002)


@pytest.mark.sqlite  # backend-independent (own SQLite file): run once
@pytest.mark.slow
def test_a_removed_released_migration_fails_the_check(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    (tree / RELEASED_0002).unlink()
    proc = run(tree, "check_migrations", "--json")
    assert proc.returncode != 0
    errors = json.loads(proc.stdout)["errors"]
    assert {"kind": "released_removed", "file": RELEASED_0002} in [
        {"kind": e["kind"], "file": e["file"]} for e in errors
    ]


# --- 2. model changes without a migration ---------------------------------------------------------


@pytest.mark.sqlite  # backend-independent (own SQLite file): run once
@pytest.mark.slow
def test_a_model_change_without_a_migration_fails_the_check(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    with (tree / "ledger" / "models" / "runs.py").open("a") as f:
        f.write(
            "\n\nclass H7Drift(models.Model):\n"
            "    note = models.TextField()\n\n"
            "    def __str__(self) -> str:\n        return self.note\n"
        )
    proc = run(tree, "check_migrations")
    assert_fails_naming(proc, "missing_migration", "ledger/models/")
    assert "Create model H7Drift" in proc.stderr


# --- 3. irreversible migrations -------------------------------------------------------------------


@pytest.mark.sqlite  # backend-independent (own SQLite file): run once
@pytest.mark.slow
def test_an_irreversible_migration_fails_the_check(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    path = add_migration(
        tree,
        "0999_h7_backfill",
        "migrations.RunPython(forward), migrations.RunSQL('SELECT 1')",
    )
    proc = run(tree, "check_migrations")
    assert_fails_naming(proc, "irreversible", path)
    assert "RunPython without reverse_code" in proc.stderr
    assert "RunSQL without reverse_sql" in proc.stderr


# --- 4. non-additive migrations, and releasing one with a reason ------------------------------------


@pytest.mark.sqlite  # backend-independent (own SQLite file): run once
@pytest.mark.slow
def test_a_non_additive_migration_fails_until_released_with_a_reason_and_a_breaking_name(
    tmp_path: Path,
) -> None:
    tree = make_tree(tmp_path)
    # Narrows a column the previous release writes, then restores it (so the models still
    # match), and drops an index by hand: state-consistent, and still not additive.
    operations = (
        "migrations.AlterField('workflowworkitem', 'route_key', models.CharField(max_length=50)),"
        " migrations.AlterField('workflowworkitem', 'route_key', models.CharField(max_length=100)),"
        " migrations.RunSQL('DROP INDEX idx_loops_name', 'CREATE INDEX idx_loops_name ON loops (name)')"
    )
    path = add_migration(tree, "0999_h7_narrow_route_key", operations)
    proc = run(tree, "check_migrations")
    assert_fails_naming(proc, "non_additive", path)
    assert "shortens route_key from max_length 100 to 50" in proc.stderr
    assert "RunSQL contains 'DROP'" in proc.stderr

    refused = run(tree, "lock_migrations")
    assert refused.returncode != 0 and path in refused.stderr
    # A reason alone is not enough: older releases must be able to recognise it by name.
    key = "ledger/0999_h7_narrow_route_key"
    refused = run(
        tree, "lock_migrations", "--reason", f"{key}=route keys never exceed 50"
    )
    assert refused.returncode != 0 and "must contain `breaking`" in refused.stderr

    (tree / path).rename(tree / path.replace(".py", "_breaking.py"))
    key += "_breaking"
    locked = run(
        tree, "lock_migrations", "--reason", f"{key}=route keys never exceed 50"
    )
    assert locked.returncode == 0, locked.stderr
    assert f"{key}.py" in locked.stdout
    assert "reason=route keys never exceed 50" in (tree / "migrations.lock").read_text()

    accepted = run(tree, "check_migrations")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "WARNING [non_additive]" in accepted.stdout
    assert "route keys never exceed 50" in accepted.stdout


# --- 5. migrations applied by a newer release -----------------------------------------------------


@pytest.mark.django_db
def test_unknown_applied_migrations_are_accepted_with_a_warning_unless_named_breaking() -> (
    None
):
    recorder = MigrationRecorder(connection)
    recorder.record_applied("ledger", "0999_from_a_newer_release")
    report = check_migrations()
    assert report.ok, report.errors
    assert [(w.kind, w.file) for w in report.warnings] == [
        ("unknown_applied", "ledger/migrations/0999_from_a_newer_release.py")
    ]

    recorder.record_applied("ledger", "0998_drop_last_reason_breaking")
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("check_migrations", "--json", stdout=out, stderr=err)
    assert failed.value.returncode == 1
    report_json = json.loads(out.getvalue())
    assert report_json["ok"] is False
    assert report_json["errors"] == [
        {
            "kind": "unknown_applied",
            "file": "ledger/migrations/0998_drop_last_reason_breaking.py",
            "message": report_json["errors"][0]["message"],
        }
    ]
    assert "newer release" in report_json["errors"][0]["message"]


def test_an_unknown_database_alias_is_a_clear_error() -> None:
    with pytest.raises(CommandError, match="unknown database alias 'nope'"):
        call_command("check_migrations", "--database", "nope")


# --- lock_migrations ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_lock_migrations_dry_run_lists_unreleased_migrations_and_writes_nothing(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "migrations.lock"
    first = next(
        line
        for line in (ROOT / "migrations.lock").read_text().splitlines()
        if line.startswith("ledger/0001_initial.py")
    )
    lock.write_text(first + "\n")
    out = io.StringIO()
    call_command("lock_migrations", "--dry-run", "--lock-file", str(lock), stdout=out)
    assert "would add: ledger/0002_work_item_route_scope.py " in out.getvalue()
    assert "would add: ledger/0001_initial.py" not in out.getvalue()
    assert lock.read_text() == first + "\n"

    call_command("lock_migrations", "--lock-file", str(lock), stdout=io.StringIO())
    keys = [e.key for e in read_lock(lock)]
    assert keys[:2] == [
        "ledger/0001_initial.py",
        "ledger/0002_work_item_route_scope.py",
    ]
    assert "routing/0001_initial.py" in keys
    report = check_migrations(lock_path=lock)
    assert not [e for e in report.errors if e.kind.startswith("released")]


def test_lock_migrations_refuses_a_reason_for_a_migration_it_is_not_locking(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "migrations.lock"
    shutil.copy2(ROOT / "migrations.lock", lock)
    with pytest.raises(CommandError, match="ledger/0001_initial.py: not a migration"):
        call_command(
            "lock_migrations",
            "--dry-run",
            "--lock-file",
            str(lock),
            "--reason",
            "ledger/0001_initial=typo",
        )


@pytest.mark.django_db
def test_a_malformed_lock_file_is_reported_with_its_line(tmp_path: Path) -> None:
    lock = tmp_path / "migrations.lock"
    lock.write_text("# ok\nledger/0001_initial.py not-a-hash\n")
    with pytest.raises(LockFileError, match="line 2"):
        read_lock(lock)
    kinds = {(e.kind, e.file) for e in check_migrations(lock_path=lock).errors}
    assert ("lock_file", str(lock)) in kinds


# --- the rules, operation by operation (no database) ----------------------------------------------


def _released() -> ProjectState:
    """What the previous release knows: one model, `ledger.thing`."""
    state = ProjectState()
    state.add_model(
        ModelState(
            "ledger",
            "thing",
            [
                ("id", models.AutoField(primary_key=True)),
                ("name", models.CharField(max_length=100)),
                ("note", models.TextField(null=True)),
                ("size", models.IntegerField(default=0)),
            ],
        )
    )
    return state


def _noop(apps: Any, schema_editor: Any) -> None:
    pass


class _Custom(Operation):
    reversible = False

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        pass


NON_ADDITIVE = [
    (
        ops.AddField("thing", "flag", models.BooleanField(default=False)),
        "without db_default",
    ),
    (ops.RemoveField("thing", "note"), "removes field thing.note"),
    (ops.DeleteModel("thing"), "deletes model thing"),
    (ops.RenameField("thing", "name", "title"), "renames field thing.name"),
    (ops.RenameModel("thing", "widget"), "renames model thing"),
    (ops.AlterModelTable("thing", "things"), "renames the table"),
    (ops.AlterField("thing", "name", models.CharField(max_length=50)), "shortens name"),
    (ops.AlterField("thing", "note", models.TextField()), "makes note NOT NULL"),
    (
        ops.AlterField("thing", "size", models.CharField(max_length=10)),
        "changes the type",
    ),
    (
        ops.AlterField("thing", "name", models.CharField(max_length=100, unique=True)),
        "makes name unique",
    ),
    (
        ops.AddConstraint(
            "thing", models.UniqueConstraint(fields=["name"], name="thing_name")
        ),
        "adds constraint thing_name",
    ),
    (ops.RunSQL("ALTER TABLE t DROP COLUMN a", "SELECT 1"), "'DROP'"),
    (ops.RunSQL("ALTER TABLE t RENAME COLUMN a TO b", "SELECT 1"), "'RENAME'"),
    (
        ops.RunSQL("ALTER TABLE t ALTER COLUMN a SET NOT NULL", "SELECT 1"),
        "SET NOT NULL",
    ),
    (_Custom(), "cannot be classified"),
]
ADDITIVE = [
    ops.AddField("thing", "flag", models.BooleanField(db_default=False)),
    ops.AddField("thing", "memo", models.TextField(null=True)),
    # A model the previous release does not know: anything goes.
    ops.AddField("newthing", "n", models.IntegerField(default=0)),
    ops.CreateModel("newthing", [("id", models.AutoField(primary_key=True))]),
    ops.AlterField("thing", "name", models.CharField(max_length=200)),
    ops.AlterField("thing", "name", models.TextField()),
    ops.AlterField("thing", "size", models.BigIntegerField(default=0)),
    ops.AddIndex("thing", models.Index(fields=["name"], name="thing_name_idx")),
    ops.RemoveIndex("thing", "thing_name_idx"),
    ops.RunSQL(
        "CREATE INDEX i ON t (a)", "DROP INDEX i"
    ),  # only the forward SQL matters
    ops.RunPython(_noop, ops.RunPython.noop),
]


@pytest.mark.parametrize(("op", "expected"), NON_ADDITIVE)
def test_operations_that_break_the_previous_release_are_not_additive(
    op: Operation, expected: str
) -> None:
    reasons = non_additive_reasons(op, "ledger", _released())
    assert any(expected in r for r in reasons), reasons


@pytest.mark.parametrize("op", ADDITIVE)
def test_operations_the_previous_release_survives_are_additive(op: Operation) -> None:
    assert non_additive_reasons(op, "ledger", _released()) == []


def test_separate_database_and_state_is_judged_by_its_database_operations() -> None:
    op = ops.SeparateDatabaseAndState(
        database_operations=[ops.RunSQL("ALTER TABLE t DROP COLUMN a")],
        state_operations=[ops.RemoveField("thing", "note")],
    )
    inner = list(database_operations([op]))
    assert [type(o) for o in inner] == [ops.RunSQL]
    assert irreversible_reason(inner[0]) == "RunSQL without reverse_sql"


@pytest.mark.parametrize(
    ("op", "irreversible"),
    [
        (ops.RunPython(_noop), True),
        (ops.RunPython(_noop, ops.RunPython.noop), False),
        (ops.RunSQL("SELECT 1"), True),
        (ops.RunSQL("SELECT 1", "SELECT 1"), False),
        (_Custom(), True),
        (ops.AddField("thing", "memo", models.TextField(null=True)), False),
    ],
)
def test_irreversible_operations_are_named(op: Operation, irreversible: bool) -> None:
    assert (irreversible_reason(op) is not None) is irreversible


@pytest.mark.parametrize(
    ("name", "marked"),
    [
        ("0005_drop_last_reason_breaking", True),
        ("0005_breaking_rename", True),
        ("0005_nonbreaking_index", False),
        ("0005_add_route_scope", False),
    ],
)
def test_the_breaking_marker_is_a_whole_word_of_the_name(
    name: str, marked: bool
) -> None:
    assert has_breaking_marker(name) is marked
