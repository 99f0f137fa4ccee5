"""From task to pull request (issue 40): each step's commit, and what a run delivered.

Additive: nullable columns only. `workflow_step_runs.commit_sha` / `commit_diffstat` (the
commit of what the step changed on the run's branch, ledger.step_commits);
`workflow_runs.delivery_json` (the delivery: mode, pushed ref and commit, pull request
number, URL and state, or its error: ledger.delivery) and `work_discarded_at` (the run's
branch and worktree deleted by "Discard").
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0020_host_projects"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowsteprun",
            name="commit_sha",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="workflowsteprun",
            name="commit_diffstat",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="delivery_json",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="work_discarded_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
