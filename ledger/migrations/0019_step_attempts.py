"""Step attempts (issue 39): one row per try of a step on an account (a move after a rate
limit, a retry), so the rate-limited account and the time spent on it stay on record.

Additive: a new table `workflow_step_attempts` with two indexes.
"""

import django.db.models.deletion
from django.db import migrations, models

import ledger.ids


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0018_account_login_failed"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkflowStepAttempt",
            fields=[
                (
                    "id",
                    models.CharField(
                        default=ledger.ids.new_id,
                        editable=False,
                        max_length=32,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("step_id", models.CharField(max_length=200)),
                (
                    "account_profile",
                    models.CharField(blank=True, max_length=200, null=True),
                ),
                (
                    "account_tool",
                    models.CharField(blank=True, max_length=100, null=True),
                ),
                ("status", models.CharField(max_length=20)),
                ("started_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("duration_ms", models.BigIntegerField(blank=True, null=True)),
                ("exit_code", models.IntegerField(blank=True, null=True)),
                ("error", models.TextField(blank=True, null=True)),
                ("usage_input_tokens", models.BigIntegerField(blank=True, null=True)),
                ("usage_output_tokens", models.BigIntegerField(blank=True, null=True)),
                ("usage_cached_tokens", models.BigIntegerField(blank=True, null=True)),
                ("usage_cost_usd", models.FloatField(blank=True, null=True)),
                (
                    "step_run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempts",
                        to="ledger.workflowsteprun",
                    ),
                ),
                (
                    "workflow_run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempts",
                        to="ledger.workflowrun",
                    ),
                ),
            ],
            options={
                "db_table": "workflow_step_attempts",
                "indexes": [
                    models.Index(
                        fields=["step_run", "started_at"], name="idx_step_attempts_step"
                    ),
                    models.Index(fields=["workflow_run"], name="idx_step_attempts_run"),
                ],
            },
        ),
    ]
