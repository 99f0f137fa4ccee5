"""An account whose step hung (no progress for its idle limit) cools off:
`accounts.unresponsive_until` and `accounts.unresponsive_reason` (ledger.services.cooldowns).

Additive: two nullable columns, which the previous release neither reads nor writes (it
just does not skip such an account). Reversing drops them.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0025_step_egress_refused"),
    ]

    operations = [
        migrations.AddField(
            model_name="account",
            name="unresponsive_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="account",
            name="unresponsive_reason",
            field=models.TextField(blank=True, null=True),
        ),
    ]
