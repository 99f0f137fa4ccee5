from django.db import migrations, models


class Migration(migrations.Migration):
    """The drain record's freshnessClosed count (issue 40): additive, a database default
    so the previous release's inserts still work."""

    dependencies = [
        ("routing", "0003_api_token_expires_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="drainrecord",
            name="freshness_closed",
            field=models.IntegerField(db_default=0, default=0),
        ),
    ]
