"""The agent boundary (issue 38): why a run's work was not committed, and how many
processes a step left behind that were ended.

Additive: two nullable columns. `workflow_runs.commit_error` (ledger.run_worktree fills it
when the worktree's `.git` was tampered with or the commit could not be made; that worktree
is never pruned); `workflow_step_runs.processes_ended` (ledger.stepguard's count).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0011_hosts"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="commit_error",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowsteprun",
            name="processes_ended",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
