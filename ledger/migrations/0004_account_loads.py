# loopsweb: account load kept per account (issue 18). Additive: a new table, filled from the
# rows it counts (the same recount as ledger.loads.recount_account_loads, inlined so that this
# migration never changes with the code).

from django.db import migrations, models

_FILL = """
INSERT INTO workflow_account_loads (account_profile, running, reserved, updated_at)
SELECT account_profile, SUM(running), SUM(reserved), CURRENT_TIMESTAMP FROM (
    SELECT account_profile, COUNT(*) AS running, 0 AS reserved
    FROM workflow_step_runs
    WHERE status = 'running' AND account_profile IS NOT NULL
    GROUP BY account_profile
    UNION ALL
    SELECT account_profile, 0, COUNT(*) FROM (
        SELECT s.account_profile, s.status,
               ROW_NUMBER() OVER (
                   PARTITION BY s.workflow_run_id
                   ORDER BY CASE WHEN s.account_profile IS NULL THEN 1 ELSE 0 END, s.sequence
               ) AS rn,
               SUM(CASE WHEN s.status <> 'pending' THEN 1 ELSE 0 END) OVER (
                   PARTITION BY s.workflow_run_id
               ) AS started
        FROM workflow_step_runs s
        JOIN workflow_runs r ON r.id = s.workflow_run_id
        WHERE r.status IN ('queued', 'running')
    ) firsts
    WHERE rn = 1 AND started = 0 AND account_profile IS NOT NULL AND status = 'pending'
    GROUP BY account_profile
) loads
GROUP BY account_profile
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0003_admission_records_leases_cooldowns"),
    ]

    operations = [
        migrations.CreateModel(
            name="AccountLoadCount",
            fields=[
                (
                    "account_profile",
                    models.CharField(max_length=200, primary_key=True, serialize=False),
                ),
                ("running", models.IntegerField(default=0)),
                ("reserved", models.IntegerField(default=0)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "db_table": "workflow_account_loads",
            },
        ),
        migrations.RunSQL(_FILL, reverse_sql=migrations.RunSQL.noop),
    ]
