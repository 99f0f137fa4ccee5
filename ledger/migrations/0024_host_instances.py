"""Hosts and workers known by what cannot repeat (issue 43): a run cluster instance per start.

Additive: `loopsweb_hosts.machine_id`, `boot_id` and `instance` (what the host last reported
from, beside its name), `loopsweb_run_workers.instance` (the worker's cluster instance: its
claims are `<host>:<pid>@<instance>`), all with a database default of ''; the nullable
`workflow_runs.lost_with_host` (the run ended because its host was gone); and the new table
`loopsweb_cluster_instances` (one row per run cluster start: machine id, boot id, PID
namespace, the qcluster's pid and start time, roots, heartbeat; `cluster` false for a
process outside any run cluster that claims runs).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0023_step_reason_code"),
    ]

    operations = [
        migrations.AddField(
            model_name="host",
            name="boot_id",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=64
            ),
        ),
        migrations.AddField(
            model_name="host",
            name="instance",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=40
            ),
        ),
        migrations.AddField(
            model_name="host",
            name="machine_id",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=300
            ),
        ),
        migrations.AddField(
            model_name="runworker",
            name="instance",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=40
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="lost_with_host",
            field=models.CharField(blank=True, max_length=80, null=True),
        ),
        migrations.CreateModel(
            name="ClusterInstance",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True,
                        primary_key=True,
                        serialize=False,
                        verbose_name="ID",
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("instance", models.CharField(max_length=40, unique=True)),
                ("host", models.CharField(max_length=80)),
                ("machine_id", models.CharField(max_length=300)),
                ("boot_id", models.CharField(max_length=64)),
                ("pid_namespace", models.CharField(max_length=64)),
                ("pid", models.IntegerField()),
                ("pid_started", models.BigIntegerField(blank=True, null=True)),
                ("roots", models.JSONField(default=list)),
                ("seen_at", models.DateTimeField()),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
                ("cluster", models.BooleanField(default=True)),
            ],
            options={
                "db_table": "loopsweb_cluster_instances",
                "indexes": [
                    models.Index(
                        fields=["host", "seen_at"], name="idx_cluster_inst_host_seen"
                    )
                ],
            },
        ),
    ]
