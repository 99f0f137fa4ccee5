"""Migration safety checks behind `manage.py check_migrations` and `manage.py lock_migrations`.

loopsweb keeps upstream's 0.4.12 promise: a ledger upgrades in place, keeps its data, and stays
usable by the previous release. These checks make the promise checkable in CI. Every finding
names a file (a migration, the models module, or the lock file).

Errors (the check fails):
1. `released_edited` / `released_removed`: the lock file, `migrations.lock` at the repository
   root, lists every released migration as `app/NNNN_name.py <sha256> [reason=TEXT]`. A
   listed file must exist and still hash the same (SHA-256 of the file with CRLF read as LF).
   A deployment that ran the old text would otherwise silently differ from a fresh one.
2. `missing_migration`: the ledger/routing models have changes no migration describes (the
   autodetector, as `makemigrations --check` runs it).
3. `irreversible`: a ledger/routing migration has an operation that cannot be reversed
   (RunPython without reverse_code, RunSQL without reverse_sql, or any operation whose
   `reversible` is False, also inside SeparateDatabaseAndState), so `migrate ledger <earlier>`
   would stop half-way.
4. `non_additive`: every ledger/routing migration except the baseline, `ledger/0001_initial`
   (the first release loopsweb upgrades from), must be additive, so that the previous release
   keeps reading and writing a migrated database. An unreleased migration is measured against
   the latest release (the state at every locked migration): for the tables and columns that
   release knows, no RemoveField, DeleteModel, RenameField, RenameModel, AlterModelTable, no
   AlterField that narrows (shorter max_length, NULL to NOT NULL, a type change other than a
   widening, a renamed column, a new UNIQUE), no AddField NOT NULL without `db_default` (a
   Python `default` is not enough: old code inserts rows without the column), no new
   constraint; anywhere, no RunSQL that drops, renames, truncates, sets NOT NULL or changes a
   column type, and no operation we cannot classify. Tables and columns only unreleased
   migrations created may change freely. The exception is explicit: `lock_migrations --reason
   app/name=WHY` releases a non-additive migration whose name contains `breaking` (see
   `unknown_applied`), recording `reason=` in the lock file; it is then reported as a warning.
   Released migrations were measured when they were locked and are frozen by their hash since.
5. `unknown_applied`: the database has ledger/routing migrations applied that this code does
   not have (a newer release migrated it). Their operations cannot be inspected from here.
   Newer releases are held to `non_additive`, so an unknown migration is additive: it is
   reported as a warning and accepted, the way upstream tolerates newer ledger rows. The one
   exception a newer release can announce is in the name the database records: a migration
   named with `breaking` (`non_additive` forces that name on every reasoned non-additive
   migration) means this code is too old for the database, and the check fails.
Also errors: an unreadable lock file (`lock_file`), two leaf migrations in one app
(`conflict`), a migration graph that does not load (`graph`), applied migrations whose
dependencies are not applied (`inconsistent_history`), a database that cannot be read
(`database`).

Pending migrations are not an error: they are what the next `migrate` applies. The plan
(applied and pending, per migration) is part of every report.

What makes one operation irreversible or non-additive (`irreversible` and `non_additive`) is
`ledger.migration_rules`; this module applies the rules to the migrations on disk, the lock
file and the database.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

from django.apps import apps as global_apps
from django.conf import settings
from django.db import DatabaseError, connections
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.exceptions import InconsistentMigrationHistory
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.migration import Migration
from django.db.migrations.questioner import MigrationQuestioner
from django.db.migrations.recorder import MigrationRecorder
from django.db.migrations.state import ProjectState

from ledger.migration_rules import (
    database_operations,
    has_breaking_marker,
    irreversible_reason,
    migration_non_additive_reasons,
)

# The apps whose migrations we write and therefore hold to these rules.
OUR_APPS: tuple[str, ...] = ("ledger", "routing")
# The first release: its schema is what every later migration must stay compatible with.
BASELINE: frozenset[tuple[str, str]] = frozenset({("ledger", "0001_initial")})

LOCK_LINE = re.compile(
    r"^(?P<app>[a-z_][a-z0-9_]*)/(?P<name>\w+)\.py\s+(?P<sha>[0-9a-f]{64})"
    r"(?:\s+reason=(?P<reason>\S.*?))?\s*$"
)


# --- report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    kind: str
    file: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "file": self.file, "message": self.message}


@dataclass(frozen=True)
class PlanEntry:
    app: str
    name: str
    applied: bool

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.app, "name": self.name, "applied": self.applied}


@dataclass
class Report:
    database: str
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    plan: list[PlanEntry] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "database": self.database,
            "errors": [f.to_dict() for f in self.errors],
            "warnings": [f.to_dict() for f in self.warnings],
            "plan": [p.to_dict() for p in self.plan],
        }


# --- the lock file --------------------------------------------------------------------------


@dataclass(frozen=True)
class LockEntry:
    app: str
    name: str
    sha256: str
    reason: str | None = None

    @property
    def key(self) -> str:
        return f"{self.app}/{self.name}.py"

    def line(self) -> str:
        tail = f" reason={self.reason}" if self.reason else ""
        return f"{self.key} {self.sha256}{tail}"


class LockFileError(ValueError):
    pass


def default_lock_path() -> Path:
    return Path(settings.BASE_DIR) / "migrations.lock"


def display_path(path: Path) -> str:
    """The path relative to the repository root when it lies inside it (what people type)."""
    try:
        return str(path.resolve().relative_to(Path(settings.BASE_DIR).resolve()))
    except ValueError:
        return str(path)


def migration_sha256(path: Path) -> str:
    # CRLF read as LF: a checkout with Windows line endings is the same release.
    return hashlib.sha256(path.read_bytes().replace(b"\r\n", b"\n")).hexdigest()


def read_lock(path: Path) -> list[LockEntry]:
    """Entries of the lock file, in file order. Blank lines and `#` comments are skipped."""
    entries: list[LockEntry] = []
    seen: set[str] = set()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError:
        raise LockFileError(f"{display_path(path)} is not UTF-8 text") from None
    except OSError as exc:
        raise LockFileError(
            f"cannot read {display_path(path)}: {exc.strerror}"
        ) from None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = LOCK_LINE.match(line)
        if not match:
            raise LockFileError(
                f"line {number}: expected `app/NNNN_name.py <sha256> [reason=TEXT]`, got {raw!r}"
            )
        entry = LockEntry(
            match["app"], match["name"], match["sha"], match["reason"] or None
        )
        if entry.key in seen:
            raise LockFileError(f"line {number}: {entry.key} is listed twice")
        seen.add(entry.key)
        entries.append(entry)
    return entries


def migrations_dir(app_label: str) -> Path | None:
    """The directory of the app's migrations package (honours MIGRATION_MODULES)."""
    module_name, _ = MigrationLoader.migrations_module(app_label)
    if module_name is None:
        return None
    try:
        module = import_module(module_name)
    except ImportError:
        return None
    paths = list(getattr(module, "__path__", []))
    return Path(paths[0]) if paths else None


def migration_file(app_label: str, name: str) -> Path:
    directory = migrations_dir(app_label)
    if directory is None:
        directory = Path(settings.BASE_DIR) / app_label / "migrations"
    return directory / f"{name}.py"


def _released_findings(entries: Iterable[LockEntry]) -> Iterator[Finding]:
    for entry in entries:
        path = migration_file(entry.app, entry.name)
        shown = display_path(path)
        if not path.is_file():
            yield Finding(
                "released_removed",
                shown,
                f"released migration {entry.key} is listed in the lock file but missing: "
                "released migrations are never removed (restore it)",
            )
        elif (actual := migration_sha256(path)) != entry.sha256:
            yield Finding(
                "released_edited",
                shown,
                f"released migration {entry.key} was edited (sha256 {actual[:12]}…, "
                f"locked {entry.sha256[:12]}…): restore it and put the change in a new migration",
            )


def released_state(loader: MigrationLoader, locked: Iterable[str]) -> ProjectState:
    """The project state at the latest release: the baseline plus every locked migration."""
    nodes = set(BASELINE)
    for key in locked:
        app_label, _, rest = key.partition("/")
        nodes.add((app_label, rest.removesuffix(".py")))
    return loader.project_state(sorted(n for n in nodes if n in loader.graph.nodes))


# --- the checks -------------------------------------------------------------------------------


def _migration_path(migration: Migration) -> str:
    try:
        return display_path(Path(inspect.getfile(type(migration))))
    except (TypeError, OSError):
        return f"{migration.app_label}/migrations/{migration.name}.py"


def _models_path(app_label: str) -> str:
    module = global_apps.get_app_config(app_label).models_module
    file = getattr(module, "__file__", None)  # None without models or a file
    if file:
        path = Path(file)
        if path.name == "__init__.py":  # a models package: its directory
            return display_path(path.parent) + "/"
        return display_path(path)
    return f"{app_label}/models.py"


def _missing_migration_findings(loader: MigrationLoader) -> Iterator[Finding]:
    # The base questioner never prompts and never exits (the non-interactive one calls
    # sys.exit on a NOT NULL field without a default); it answers every question "no".
    questioner = MigrationQuestioner(specified_apps=set(OUR_APPS), dry_run=True)
    autodetector = MigrationAutodetector(
        loader.project_state(), ProjectState.from_apps(global_apps), questioner
    )
    changes = autodetector.changes(
        graph=loader.graph, trim_to_apps=set(OUR_APPS), convert_apps=set(OUR_APPS)
    )
    for app_label in sorted(changes):
        described = [
            op.describe()
            for migration in changes[app_label]
            for op in migration.operations
        ]
        yield Finding(
            "missing_migration",
            _models_path(app_label),
            f"models of {app_label} have changes with no migration ({'; '.join(described)}): "
            f"run `python manage.py makemigrations {app_label} -n <name>`",
        )


def _migration_findings(
    loader: MigrationLoader, locked: Mapping[str, LockEntry]
) -> tuple[list[Finding], list[Finding]]:
    """`irreversible` and `non_additive` (module docstring) over every ledger/routing migration
    on disk.

    `non_additive` analyses unreleased migrations against the latest release. A released
    migration was analysed by lock_migrations when it was locked and is frozen by its hash
    since, so it is only reported when it was released with a reason.
    """
    errors: list[Finding] = []
    warnings: list[Finding] = []
    released = released_state(loader, locked)
    for app_label, name in sorted(loader.disk_migrations):
        if app_label not in OUR_APPS:
            continue
        migration = loader.disk_migrations[(app_label, name)]
        path = _migration_path(migration)
        for op in database_operations(migration.operations):
            if reason := irreversible_reason(op):
                errors.append(
                    Finding(
                        "irreversible",
                        path,
                        f"{app_label}.{name} cannot be reversed: {reason}; "
                        f"`migrate {app_label} <earlier>` would stop half-way",
                    )
                )
        if (app_label, name) in BASELINE:
            continue
        entry = locked.get(f"{app_label}/{name}.py")
        if entry is not None:
            if entry.reason and not has_breaking_marker(name):
                errors.append(
                    Finding(
                        "non_additive",
                        path,
                        f"{app_label}.{name} was released as not additive ({entry.reason}) "
                        "but its name lacks `breaking`, which older releases read to "
                        "refuse the database",
                    )
                )
            elif entry.reason:
                warnings.append(
                    Finding(
                        "non_additive",
                        path,
                        f"{app_label}.{name} is not additive; released with the reason: "
                        f"{entry.reason}",
                    )
                )
            continue
        problems = migration_non_additive_reasons(migration, released)
        if problems:
            errors.append(
                Finding(
                    "non_additive",
                    path,
                    f"{app_label}.{name} is not additive: {'; '.join(problems)}. The previous "
                    "release would break on a migrated database: make it additive, or name "
                    "it `..._breaking` and release it with `lock_migrations --reason "
                    f"{app_label}/{name}=WHY`",
                )
            )
    return errors, warnings


def _known_names(loader: MigrationLoader) -> set[tuple[str, str]]:
    known = set(loader.disk_migrations)
    for migration in loader.disk_migrations.values():
        known.update((app, name) for app, name in (migration.replaces or ()))
    return known


def _database_findings(report: Report, loader: MigrationLoader, database: str) -> None:
    """`unknown_applied`, inconsistent history and the plan, read from the database
    (read-only)."""
    connection = connections[database]
    recorder = MigrationRecorder(connection)
    try:
        applied = set(recorder.applied_migrations()) if recorder.has_table() else set()
        loader.check_consistent_history(connection)
    except InconsistentMigrationHistory as exc:
        report.errors.append(Finding("inconsistent_history", database, str(exc)))
    except DatabaseError as exc:
        report.errors.append(
            Finding("database", database, f"cannot read migration history: {exc}")
        )
        return
    known = _known_names(loader)
    for app_label, name in sorted(applied - known):
        if app_label not in OUR_APPS:
            continue
        path = display_path(migration_file(app_label, name))
        if has_breaking_marker(name):
            report.errors.append(
                Finding(
                    "unknown_applied",
                    path,
                    f"{app_label}.{name} is applied on database {database!r} but unknown to "
                    "this code, and its name marks it breaking: a newer release changed the "
                    "schema incompatibly; run that release (or newer)",
                )
            )
        else:
            report.warnings.append(
                Finding(
                    "unknown_applied",
                    path,
                    f"{app_label}.{name} is applied on database {database!r} but unknown to "
                    "this code (a newer release migrated it); accepted: newer migrations "
                    "are additive unless named breaking",
                )
            )
    seen: set[tuple[str, str]] = set()
    for leaf in sorted(loader.graph.leaf_nodes()):
        for node in loader.graph.forwards_plan(leaf):
            if node not in seen:
                seen.add(node)
                report.plan.append(PlanEntry(node[0], node[1], node in applied))


def check_migrations(
    *, database: str = "default", lock_path: Path | None = None
) -> Report:
    """Run every check; never writes to the database or the lock file."""
    lock_path = lock_path or default_lock_path()
    report = Report(database=database)
    locked: dict[str, LockEntry] = {}
    try:
        entries = read_lock(lock_path)
    except FileNotFoundError:
        report.errors.append(
            Finding(
                "lock_file",
                display_path(lock_path),
                "the lock file is missing (it lists the released migrations)",
            )
        )
        entries = []
    except LockFileError as exc:
        report.errors.append(Finding("lock_file", display_path(lock_path), str(exc)))
        entries = []
    locked = {e.key: e for e in entries}
    report.released = list(locked)
    # `released_edited` / `released_removed` read files only, so they still run when the
    # graph below cannot be built.
    report.errors.extend(_released_findings(entries))

    try:
        loader = MigrationLoader(None, ignore_no_migrations=True)
    except Exception as exc:  # any import or graph error is itself the finding
        # NodeNotFoundError carries the migration whose dependency is missing.
        origin = getattr(exc, "origin", None)
        where = (
            _migration_path(origin)
            if isinstance(origin, Migration)
            else ", ".join(f"{app}/migrations" for app in OUR_APPS)
        )
        report.errors.append(Finding("graph", where, f"migrations do not load: {exc}"))
        return report
    conflicts = loader.detect_conflicts()
    for app_label, names in sorted(conflicts.items()):
        files = ", ".join(display_path(migration_file(app_label, n)) for n in names)
        report.errors.append(
            Finding(
                "conflict",
                files,
                f"{app_label} has {len(names)} leaf migrations ({', '.join(names)}): "
                "merge them (makemigrations --merge) or renumber one",
            )
        )
    if not conflicts:  # like makemigrations, the autodetector needs one leaf per app
        report.errors.extend(_missing_migration_findings(loader))
    errors, warnings = _migration_findings(loader, locked)
    report.errors.extend(errors)
    report.warnings.extend(warnings)
    _database_findings(report, loader, database)
    return report


# --- locking ---------------------------------------------------------------------------------


def normalise_reason_key(key: str) -> str:
    key = key.strip()
    return key if key.endswith(".py") else f"{key}.py"


def new_lock_entries(
    *, lock_path: Path | None = None, reasons: Mapping[str, str] | None = None
) -> tuple[list[LockEntry], list[str]]:
    """Entries for every ledger/routing migration on disk that the lock does not list yet.

    Returns (entries, problems). A migration cannot be released when it is irreversible, or
    non-additive without a reason (and then `breaking` in its name); a reason naming no new
    migration is a problem too (most likely a typo).
    """
    lock_path = lock_path or default_lock_path()
    reasons = {normalise_reason_key(k): v.strip() for k, v in (reasons or {}).items()}
    locked = {e.key for e in read_lock(lock_path)} if lock_path.exists() else set()
    loader = MigrationLoader(None, ignore_no_migrations=True)
    # Every migration of this release is measured against the previous release.
    released = released_state(loader, locked)
    entries: list[LockEntry] = []
    problems: list[str] = []
    for app_label, name in sorted(loader.disk_migrations):
        if app_label not in OUR_APPS or f"{app_label}/{name}.py" in locked:
            continue
        migration = loader.disk_migrations[(app_label, name)]
        key = f"{app_label}/{name}.py"
        path = Path(inspect.getfile(type(migration)))
        for op in database_operations(migration.operations):
            if reason := irreversible_reason(op):
                problems.append(f"{display_path(path)}: cannot be reversed: {reason}")
        reason_text = reasons.pop(key, None)
        if reason_text is not None and ("\n" in reason_text or not reason_text):
            problems.append(f"{key}: a reason must be one non-empty line")
        if (app_label, name) not in BASELINE:
            found = migration_non_additive_reasons(migration, released)
            if found and not reason_text:
                problems.append(
                    f"{display_path(path)}: not additive ({'; '.join(found)}); "
                    f"pass --reason {app_label}/{name}=TEXT to release it anyway"
                )
            elif found and not has_breaking_marker(name):
                problems.append(
                    f"{display_path(path)}: not additive, so its name must contain `breaking`"
                )
            elif reason_text and not found:
                problems.append(
                    f"--reason {key}: the migration is additive, drop the reason"
                )
        entries.append(LockEntry(app_label, name, migration_sha256(path), reason_text))
    for key in sorted(reasons):
        problems.append(f"--reason {key}: not a migration that is about to be locked")
    return entries, problems


def append_lock_entries(lock_path: Path, entries: Iterable[LockEntry]) -> None:
    text = lock_path.read_text(encoding="utf-8") if lock_path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    text += "".join(f"{e.line()}\n" for e in entries)
    lock_path.write_text(text, encoding="utf-8")
