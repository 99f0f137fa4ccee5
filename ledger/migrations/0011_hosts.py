"""Hosts (issue 27): the machines that run agents register themselves (`loopsweb_hosts`), and
a run records the host that runs it, the host its worktree is on and why no host takes it yet.

Additive: a new table and four nullable columns on workflow_runs (no default to backfill).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0010_run_commit'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='host',
            field=models.CharField(blank=True, max_length=80, null=True),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='host_wait_reason',
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='host_wait_since',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='worktree_host',
            field=models.CharField(blank=True, max_length=80, null=True),
        ),
        migrations.CreateModel(
            name='Host',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('name', models.CharField(max_length=80, unique=True)),
                ('queue', models.CharField(max_length=100)),
                ('roots', models.JSONField(default=list)),
                ('providers', models.JSONField(default=list)),
                ('workers', models.IntegerField(default=0)),
                ('seen_at', models.DateTimeField()),
                ('released_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'loopsweb_hosts',
                'indexes': [models.Index(fields=['seen_at'], name='idx_hosts_seen')],
            },
        ),
    ]
