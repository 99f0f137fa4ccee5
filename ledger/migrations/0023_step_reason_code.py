"""Why a step did not succeed, stored (issue 42): `workflow_step_runs.reason_code`.

Additive: one NOT NULL column with a database default of "" (StepReasonCode.NONE), so the
previous release keeps inserting rows without it. /metrics and the account pages count
rate-limited steps by this code instead of searching the error text.

The backfill codes the steps that finished before it: a failed or timed-out step whose error
carries the runner's rate-limit note ("; provider rate limit: ...", the text 0.1 appended) is
`rate_limited`, any other failed or timed-out step `failed`. A login failure was not recorded
on the step, so no old row is coded `login_failed`. Reversing drops the column; nothing else
needs undoing.
"""

from django.db import migrations, models

# The words the runner's rate-limit note carried (ledger.runner.RATE_LIMIT_NOTE) when this
# migration was written: a frozen copy, as a migration must not follow later code.
_RATE_LIMIT_NOTE_WORDS = "; provider rate limit:"
_FAILED_STATUSES = ("failed", "timed_out")


def backfill(apps, schema_editor):
    steps = apps.get_model("ledger", "WorkflowStepRun").objects.using(
        schema_editor.connection.alias
    )
    failed = steps.filter(status__in=_FAILED_STATUSES, reason_code="")
    failed.filter(error__contains=_RATE_LIMIT_NOTE_WORDS).update(
        reason_code="rate_limited"
    )
    failed.update(reason_code="failed")


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0022_account_windows"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowsteprun",
            name="reason_code",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "none"),
                    ("rate_limited", "rate limited"),
                    ("login_failed", "login failed"),
                    ("failed", "failed"),
                ],
                db_default="",
                default="",
                max_length=20,
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
