"""What a step's sandbox refused to let out (ledger.egress): `workflow_step_runs.egress_refused`.

Additive: one nullable JSON column ("host:port" -> connections refused), which the previous
release neither reads nor writes. Reversing drops it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0024_host_instances"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowsteprun",
            name="egress_refused",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
