"""A shim for one release: django-q2 rows written before the execution moved to `runs`
(queued runs, schedules) name their function `ledger.tasks.<name>`; this module answers
them with `runs.tasks`. New rows name `runs.tasks` (ledger.queue RUN_TASK, routing's
schedules), and `manage.py sync_schedules` rewrites the schedules. Remove it in the next
release: `tests/test_layers.py` allows this one upward import and no other."""

from runs.tasks import (
    confirm_account_claim,
    prune_host_worktrees,
    prune_worktrees,
    recover_expired_runs,
    run_workflow,
)

__all__ = [
    "confirm_account_claim",
    "prune_host_worktrees",
    "prune_worktrees",
    "recover_expired_runs",
    "run_workflow",
]
