"""When a running step's agent last made progress (issue 39): a model answer or a tool call,
not a retry or an error line (ledger.agent_step). Shown on /ops/ per running step.

Additive: one nullable column, `workflow_step_runs.progress_at`.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0016_work_item_route_options"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowsteprun",
            name="progress_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
