"""Migration operations that keep PostgreSQL writable while they run.

`AddIndexWithoutBlocking` builds the index with CREATE INDEX CONCURRENTLY on PostgreSQL (writers
keep going while it builds; the migration must be `atomic = False`) and with a plain CREATE
INDEX on SQLite, where there is no such option and the build holds the single write lock.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _is_postgres(schema_editor: Any) -> bool:
    return schema_editor.connection.vendor == "postgresql"


class AddIndexWithoutBlocking(migrations.AddIndex):
    def describe(self) -> str:
        return f"Create index {self.index.name} (concurrently on PostgreSQL)"

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if not _is_postgres(schema_editor):
            schema_editor.add_index(model, self.index)
            return
        if schema_editor.connection.in_atomic_block:
            raise RuntimeError(
                f"{self.index.name}: CREATE INDEX CONCURRENTLY needs a migration with atomic = False"
            )
        # A concurrent build that was interrupted leaves an INVALID index behind; drop it so a
        # rerun of the migration can build it again instead of failing with "already exists".
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = %s AND NOT i.indisvalid",
                [self.index.name],
            )
            if cursor.fetchone():
                schema_editor.execute(
                    f'DROP INDEX CONCURRENTLY IF EXISTS "{self.index.name}"'
                )
        schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if _is_postgres(schema_editor) and not schema_editor.connection.in_atomic_block:
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)
