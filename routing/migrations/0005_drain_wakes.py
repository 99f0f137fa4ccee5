from django.db import migrations, models


class Migration(migrations.Migration):
    """Drain wake-ups by arriving events (routing.drains.wake): a new table, additive; the
    previous release never reads it."""

    dependencies = [
        ("routing", "0004_drain_freshness_closed"),
    ]

    operations = [
        migrations.CreateModel(
            name="DrainWake",
            fields=[
                (
                    "schedule",
                    models.CharField(max_length=100, primary_key=True, serialize=False),
                ),
                ("due_at", models.DateTimeField()),
            ],
            options={"db_table": "routing_drain_wakes"},
        ),
    ]
