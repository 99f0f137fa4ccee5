"""The route an item was admitted with (issue 39, "Retry keeps the route").

Additive: one nullable JSON column, `workflow_work_items.route_options_json`: the route kind,
the route options (provider, pool, --max-per-profile, the resolved scope, caps, template,
sandbox, worktree mode, time limits) and the event envelope of the item's last admission
decision, so an operator's retry re-admits it with the same route. Rows written before it
keep NULL (a retry of one only requeues it for the next drain, as before).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0012_agent_boundary"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowworkitem",
            name="route_options_json",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
