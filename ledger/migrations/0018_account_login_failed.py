"""A bad login stops getting work (issue 39): when a step on an account failed with an
authentication error, and the agent's words.

Additive: two nullable columns on `accounts` (`login_failed_at`, `login_failed_reason`),
set by the runner, cleared by `account check` and `account enable`.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0017_step_progress"),
    ]

    operations = [
        migrations.AddField(
            model_name="account",
            name="login_failed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="account",
            name="login_failed_reason",
            field=models.TextField(blank=True, null=True),
        ),
    ]
