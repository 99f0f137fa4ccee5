"""Route scoping (upstream 0.4.12, sqlite 0008 / postgres 0004): additive and rollback-safe.

- `route_scope` is nullable with no default: PostgreSQL adds it as a metadata-only change and
  SQLite as a plain ALTER TABLE ADD COLUMN (no table rebuild). Older rows keep NULL and drop
  out of scoped --max-active counts, which biases toward admitting more, never less.
- The index is built concurrently on PostgreSQL so writers are never blocked, hence
  `atomic = False`. It lives only in this migration, never in 0001.
"""

from django.db import migrations, models

from ledger.migration_operations import AddIndexWithoutBlocking


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowworkitem",
            name="route_scope",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        AddIndexWithoutBlocking(
            model_name="workflowworkitem",
            index=models.Index(fields=["route_scope", "status"], name="idx_workflow_work_items_scope"),
        ),
    ]
