"""An index on the child side of the work item -> run foreign key (workflow_run_id).

SQLite looks up the work items that point at a run whenever a run is inserted while a
deferred foreign-key violation is outstanding (a batched admission writes its items, which
name their runs, before the runs) and whenever a run is deleted. Without this index every
lookup read the whole work-item table, so admissions slowed down as the ledger grew.

Additive: one index on an existing table, built concurrently on PostgreSQL (hence non-atomic).
"""

from django.db import migrations, models

from ledger.migration_operations import AddIndexWithoutBlocking


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0007_account_registry_step_usage"),
    ]

    operations = [
        AddIndexWithoutBlocking(
            model_name="workflowworkitem",
            index=models.Index(fields=["workflow_run"], name="idx_workflow_work_items_run"),
        ),
    ]
