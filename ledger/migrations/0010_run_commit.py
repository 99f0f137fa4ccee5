"""What a run left on its branch: the head commit and the diffstat (issue 26).

Additive: two nullable columns on workflow runs (ledger.worktrees.worktree_commit fills them
at the end of a run in a worktree).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0009_account_env_file"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="commit_head",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="commit_diffstat",
            field=models.TextField(blank=True, null=True),
        ),
    ]
