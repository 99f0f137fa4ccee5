"""An account's env file: the path of a 0600 file holding an API-key login (issue 26).

Additive: one nullable column on the account registry; the database holds the path, never
the file's content (ledger.envfile reads it when a step starts).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0008_work_item_run_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="account",
            name="env_file",
            field=models.CharField(blank=True, max_length=1000, null=True),
        ),
    ]
