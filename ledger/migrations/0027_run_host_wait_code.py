"""Why a queued run waits for a host, as a code placement reads: `workflow_runs.host_wait_code`
(`checking`: the hosts have not all checked its project; `missing`: no host has it) and
`workflow_runs.host_wait_project` (that project). Until now the heartbeat read the project
back out of `host_wait_reason`'s text (ledger.hosts).

Additive: two nullable columns. The previous release neither reads nor writes them (it
parses the reason, which this release still writes). The backfill codes the runs waiting
now from their reason, with a frozen copy of the two messages (a migration must not follow
later code). Reversing drops the columns; nothing else needs undoing.
"""

from django.db import migrations, models

# The two wait messages as they were when this migration was written (ledger.hosts
# HOSTS_CHECKING and NO_HOST_HAS): a frozen copy.
_WAITS = (
    ("checking", "waiting for the hosts to check "),
    ("missing", "no host has "),
)


def backfill(apps, schema_editor):
    run_model = apps.get_model("ledger", "WorkflowRun")
    waiting = run_model.objects.filter(
        status="queued", host_wait_since__isnull=False, host_wait_code__isnull=True
    ).values_list("id", "host_wait_reason")
    for run_id, reason in waiting.iterator():
        for code, prefix in _WAITS:
            if reason and reason.startswith(prefix):
                run_model.objects.filter(pk=run_id).update(
                    host_wait_code=code, host_wait_project=reason.removeprefix(prefix)
                )
                break


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0026_account_unresponsive"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="host_wait_code",
            field=models.CharField(blank=True, max_length=16, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="host_wait_project",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
