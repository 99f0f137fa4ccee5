"""Pools that see each account's window budget (issue 41): the rate-limit window observations
per account, and an operator's token budget per window.

Additive: a new table `account_windows` (one row per observation: account, provider, window,
used fraction, status, reset, when seen, where from), and a nullable JSON column
`accounts.window_budgets`, and a nullable boolean `accounts.window_pace`.
"""

import ledger.ids
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0021_run_delivery'),
    ]

    operations = [
        migrations.AddField(
            model_name='account',
            name='window_budgets',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="account",
            name="window_pace",
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name='AccountWindow',
            fields=[
                ('id', models.CharField(default=ledger.ids.new_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('account_profile', models.CharField(max_length=200)),
                ('provider', models.CharField(blank=True, default='', max_length=20)),
                ('window', models.CharField(max_length=60)),
                ('used', models.FloatField(blank=True, null=True)),
                ('status', models.CharField(blank=True, max_length=30, null=True)),
                ('resets_at', models.DateTimeField(blank=True, null=True)),
                ('observed_at', models.DateTimeField()),
                ('source', models.CharField(blank=True, default='', max_length=200)),
                ('step_run_id', models.CharField(blank=True, max_length=32, null=True)),
            ],
            options={
                'db_table': 'account_windows',
                'indexes': [models.Index(fields=['account_profile', 'window', 'observed_at'], name='idx_account_windows_latest'), models.Index(fields=['observed_at'], name='idx_account_windows_seen')],
            },
        ),
    ]
