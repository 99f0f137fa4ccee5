"""Placement knows the checkout (issue 44): which project paths each host has, and which hosts
handed a run back.

Additive: two nullable JSON columns. `loopsweb_hosts.projects` (path → whether the host has
that project on its disk, as the host last checked: ledger.hosts; NULL, a host of an older
loopsweb that never said: its roots are trusted as before);
`workflow_runs.hosts_declined` (the hosts that handed the run back since it was last claimed:
placement skips them, so a hand-back never loops).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0019_step_attempts"),
    ]

    operations = [
        migrations.AddField(
            model_name="host",
            name="projects",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="hosts_declined",
            field=models.JSONField(default=list, null=True, blank=True),
        ),
    ]
