"""The rules `ledger.migration_checks` holds every ledger/routing migration operation to:
whether it can be reversed (its `irreversible` error) and whether the previous release keeps
working on a database it migrated (`non_additive`: additive), and the `breaking` name marker
of a migration released as non-additive on purpose (`non_additive` and `unknown_applied`).
Pure functions over Django's migration operations and project states: no database, no files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import models
from django.db.migrations import operations as ops
from django.db.migrations.migration import Migration
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

# The name marker of a deliberately non-additive migration (ledger/migration_checks.py,
# `non_additive` and `unknown_applied`).
BREAKING_MARKER = re.compile(r"(^|_)breaking(_|$)")

# Type changes that keep every value the old column could hold, and that old code can still
# write (the new column accepts everything the old one did).
WIDENINGS: frozenset[tuple[str, str]] = frozenset(
    {
        ("CharField", "TextField"),
        ("SlugField", "CharField"),
        ("SlugField", "TextField"),
        ("EmailField", "CharField"),
        ("EmailField", "TextField"),
        ("URLField", "CharField"),
        ("URLField", "TextField"),
        ("SmallIntegerField", "IntegerField"),
        ("SmallIntegerField", "BigIntegerField"),
        ("IntegerField", "BigIntegerField"),
        ("PositiveSmallIntegerField", "PositiveIntegerField"),
        ("PositiveSmallIntegerField", "PositiveBigIntegerField"),
        ("PositiveIntegerField", "PositiveBigIntegerField"),
        ("PositiveSmallIntegerField", "IntegerField"),
        ("PositiveSmallIntegerField", "BigIntegerField"),
        ("PositiveIntegerField", "BigIntegerField"),
        ("AutoField", "BigAutoField"),
        ("SmallAutoField", "AutoField"),
        ("SmallAutoField", "BigAutoField"),
    }
)
# RunSQL statements that break code reading or writing the old schema.
DESTRUCTIVE_SQL = re.compile(
    r"\b(DROP|RENAME|TRUNCATE)\b|\bSET\s+NOT\s+NULL\b|\bALTER\s+COLUMN\s+\S+\s+(SET\s+DATA\s+)?TYPE\b",
    re.IGNORECASE,
)


# --- operations -------------------------------------------------------------------------------


def database_operations(operations: Iterable[Operation]) -> Iterator[Operation]:
    """The operations that touch the database, looking inside SeparateDatabaseAndState."""
    for op in operations:
        if isinstance(op, ops.SeparateDatabaseAndState):
            yield from database_operations(op.database_operations)
        else:
            yield op


def irreversible_reason(op: Operation) -> str | None:
    """Why `op` cannot be reversed, or None when it can."""
    if isinstance(op, ops.RunPython) and op.reverse_code is None:
        return "RunPython without reverse_code (use RunPython.noop when nothing needs undoing)"
    if isinstance(op, ops.RunSQL) and op.reverse_sql is None:
        return "RunSQL without reverse_sql"
    if not op.reversible:
        return f"{type(op).__name__} is not reversible"
    return None


def _sql_text(sql: Any) -> str:
    if isinstance(sql, str):
        return sql
    if isinstance(sql, list | tuple):
        parts = []
        for item in sql:
            # A list item may be a (sql, params) pair.
            parts.append(item[0] if isinstance(item, list | tuple) else str(item))
        return "\n".join(parts)
    return str(sql)


def _model_state(state: ProjectState, app_label: str, model_name: str) -> Any:
    return state.models.get((app_label, model_name.lower()))


def _field_narrowing(name: str, old: models.Field, new: models.Field) -> list[str]:
    """What an AlterField from `old` to `new` takes away from code written for `old`."""
    problems: list[str] = []
    if old.db_column != new.db_column:
        problems.append(
            f"renames the column of {name} ({old.db_column or name} -> {new.db_column or name})"
        )
    if old.null and not new.null:
        problems.append(f"makes {name} NOT NULL")
    old_type, new_type = old.get_internal_type(), new.get_internal_type()
    if old_type != new_type and (old_type, new_type) not in WIDENINGS:
        problems.append(f"changes the type of {name} from {old_type} to {new_type}")
    old_len, new_len = (
        getattr(old, "max_length", None),
        getattr(new, "max_length", None),
    )
    if old_len is not None and new_len is not None and new_len < old_len:
        problems.append(f"shortens {name} from max_length {old_len} to {new_len}")
    if old_len is None and new_len is not None and old_type == new_type:
        problems.append(f"limits {name} to max_length {new_len}")
    for attr in ("max_digits", "decimal_places"):
        before, after = getattr(old, attr, None), getattr(new, attr, None)
        if before is not None and after is not None and after < before:
            problems.append(f"reduces {attr} of {name} from {before} to {after}")
    if not (old.unique or old.primary_key) and new.unique and not new.primary_key:
        problems.append(f"makes {name} unique (old code may write duplicates)")
    if (
        old.db_default is not models.NOT_PROVIDED
        and new.db_default is models.NOT_PROVIDED
        and not new.null
    ):
        problems.append(f"drops the database default of NOT NULL {name}")
    return problems


def non_additive_reasons(
    op: Operation, app_label: str, released: ProjectState
) -> list[str]:
    """Why `op` would break the previous release on a migrated database ([] when additive).

    `released` is the project state at the latest release (every locked migration): the
    models and fields the previous release's code reads and writes. Tables and columns it does
    not know (created by migrations not yet released) can change freely.
    """
    known = _Released(released, app_label)
    for judge in (_model_reasons, _field_reasons, _table_rule_reasons):
        found = judge(op, known)
        if found is not None:
            return found
    if isinstance(op, ops.RunSQL):
        match = DESTRUCTIVE_SQL.search(_sql_text(op.sql))
        if match:
            return [f"RunSQL contains {match.group(0).upper()!r}"]
        return []
    if isinstance(
        op,
        ops.AddIndex
        | ops.RemoveIndex
        | ops.RenameIndex
        | ops.RemoveConstraint
        | ops.AlterIndexTogether
        | ops.AlterModelOptions
        | ops.AlterModelManagers
        | ops.AlterModelTableComment
        | ops.RunPython,
    ):
        # Indexes and options do not change what old code reads or writes; RunPython changes
        # data only, and its reversibility is checked separately.
        return []
    return [
        f"{type(op).__name__} cannot be classified as additive "
        "(release it with a reason if it is safe)"
    ]


class _Released:
    """The models and fields of one app that the previous release knows."""

    def __init__(self, released: ProjectState, app_label: str) -> None:
        self.released = released
        self.app_label = app_label

    def model(self, name: str) -> Any:
        return _model_state(self.released, self.app_label, name)

    def field(self, model_name: str, field_name: str) -> models.Field | None:
        model = self.model(model_name)
        return model.fields.get(field_name) if model is not None else None


def _model_reasons(op: Operation, known: _Released) -> list[str] | None:
    """`non_additive_reasons` of an operation on a whole model (None: not one)."""
    if isinstance(op, ops.CreateModel):
        return []
    if isinstance(op, ops.DeleteModel):
        if known.model(op.name) is None:
            return []
        return [f"deletes model {op.name} (drops its table)"]
    if isinstance(op, ops.RenameModel):
        old = known.model(op.old_name)
        if old is None or old.options.get("db_table"):
            return []  # unknown to old code, or the table keeps its explicit name
        return [f"renames model {op.old_name} to {op.new_name} (renames its table)"]
    if isinstance(op, ops.AlterModelTable):
        old = known.model(op.name)
        if old is None or old.options.get("db_table") == op.table:
            return []
        return [f"renames the table of {op.name} to {op.table}"]
    return None


def _field_reasons(op: Operation, known: _Released) -> list[str] | None:
    """`non_additive_reasons` of an operation on a field (None: not one)."""
    if isinstance(op, ops.RemoveField):
        if known.field(op.model_name, op.name) is None:
            return []
        return [f"removes field {op.model_name}.{op.name} (drops its column)"]
    if isinstance(op, ops.RenameField):
        old_field = known.field(op.model_name, op.old_name)
        if old_field is None or old_field.db_column:
            return []  # unknown to old code, or the column keeps its explicit name
        return [
            f"renames field {op.model_name}.{op.old_name} to {op.new_name} (renames its column)"
        ]
    if isinstance(op, ops.AddField):
        f = op.field
        if (
            known.model(op.model_name) is None
            or f.many_to_many
            or f.null
            or f.db_default is not models.NOT_PROVIDED
            or isinstance(f, models.GeneratedField)
        ):
            return []
        return [
            f"adds NOT NULL field {op.model_name}.{op.name} without db_default "
            "(old code inserts rows without it; a Python default is not enough)"
        ]
    if isinstance(op, ops.AlterField):
        old_field = known.field(op.model_name, op.name)
        if old_field is None:
            return []
        return [
            f"alters {op.model_name}.{op.name}: {p}"
            for p in _field_narrowing(op.name, old_field, op.field)
        ]
    return None


def _table_rule_reasons(op: Operation, known: _Released) -> list[str] | None:
    """`non_additive_reasons` of an operation adding a rule to an existing table or its
    `_order` column: a constraint, unique_together, order_with_respect_to (None: not one)."""
    if isinstance(op, ops.AddConstraint):
        # The stubs leave out the attributes AddConstraint.__init__ sets (model_name,
        # constraint); AddIndex has them.
        model_name: str = op.model_name  # type: ignore[attr-defined]
        constraint: models.BaseConstraint = op.constraint  # type: ignore[attr-defined]
        if known.model(model_name) is None:
            return []
        return [
            f"adds constraint {constraint.name} to existing {model_name} "
            "(old code may write rows it refuses)"
        ]
    if isinstance(op, ops.AlterUniqueTogether):
        old = known.model(op.name)
        if old is None:
            return []
        before = {tuple(t) for t in old.options.get("unique_together", ())}
        added = {tuple(t) for t in (op.unique_together or ())} - before
        return (
            [f"adds unique_together {sorted(added)} to existing {op.name}"]
            if added
            else []
        )
    if isinstance(op, ops.AlterOrderWithRespectTo):
        if known.model(op.name) is None:
            return []
        return [f"adds or removes the _order column of {op.name}"]
    return None


def migration_non_additive_reasons(
    migration: Migration, released: ProjectState
) -> list[str]:
    return [
        reason
        for op in database_operations(migration.operations)
        for reason in non_additive_reasons(op, migration.app_label, released)
    ]


def has_breaking_marker(name: str) -> bool:
    return bool(BREAKING_MARKER.search(name))
