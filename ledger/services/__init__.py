"""Lifecycle writes of the ledger, one module per stage; this package re-exports their API.

- `common`: messages (upstream wording), status sets, errors, row locks, event append;
- `work_items`: the admit write admission calls, operator actions (requeue, retry, cancel,
  dead-letter);
- `runs`: claim, park and resume, lease, finalize, cancel;
- `cascade`: the end of a run and its cascade to steps, work item, loop and spec;
- `retries`: loop-level retries (the next attempt of a failed run);
- `recovery`: lease recovery, runs whose task may be lost;
- `hostloss`: runs whose host (or run cluster instance) is gone;
- `steps`: step start (account cap and cooldown from the rows), process record, finish, skip;
- `accounts`: the account registry (add, enable/disable, remove);
- `cooldowns`: account cooldowns after rate limits;
- `failover`: moving a step to a free member of its run's pool (step start, rate limit);
- `loops`: loop status actions (pause, resume, archive, stop, delete) and their cascades.
- `account_loads`: account load kept per account, the delta each change applies, its
  recount and repair;
- `run_workers`: a run worker's heartbeat row;
- `delivery`: the one writer of a run's delivery record, its steps' commits, its discard
  (runs.delivery, runs.discard and runs.step_commits do the git and forge work);
- `notifications`: `notify`, one message per episode that needs a human (recorded once,
  queued on commit, never raising into its caller; runs.notifications delivers it).

Rules every service follows:

- Short `transaction.atomic()` blocks. On SQLite each one takes the database write lock at
  BEGIN (IMMEDIATE), so no transaction is ever held across a subprocess or a sleep; the runner
  calls one service per state change.
- Lock order, to keep PostgreSQL free of deadlocks: the admission lock (when taken) first,
  then the run row (`select_for_update(no_key=True)`), then its steps, work item, loop, spec.
  Every service that appends an event holds the run row lock, which is what makes the
  per-run `sequence = MAX + 1` safe on PostgreSQL (SQLite's write lock covers it already).
- Conditional updates (`filter(status=<expected>)`) for claims, so a second delivery or a
  racing recovery changes nothing.

Layer: ledger services (`tests/test_layers.py`): they import the record, the reads, the queue,
the reaper (ledger.reaper: `kill_step_process_group` is re-exported here), `agents` and
`domain`; never `runs` (the runner, worktrees, tasks) or `routing` above them.
"""

from ledger.reaper import kill_step_process_group
from ledger.services.accounts import (
    AccountError,
    account_add,
    account_edit,
    account_env_parse,
    account_remove,
    account_set_enabled,
    account_window_budgets,
    login_environment,
)
from ledger.services.common import (
    CANCEL_REASON_DEFAULT,
    CANCELLABLE_STATUSES,
    DEAD_LETTERABLE_STATUSES,
    REQUEUEABLE_STATUSES,
    RUN_NOT_FOUND,
    RUN_NOT_QUEUED,
    LedgerError,
    NotFound,
    step_spec,
    steps_from_spec,
    worker_identity,
)
from ledger.services.cooldowns import (
    Cleared,
    Report,
    account_clear,
    account_cooldown_record,
    account_cooldown_report,
    account_login_clear,
    account_login_failed_record,
    account_login_failed_report,
    account_unresponsive_record,
)
from ledger.services.failover import (
    POOL_RATE_LIMITED_CODE,
    POOL_WAIT_OVER_CODE,
    pool_member_left,
    run_pool,
    step_move_after_failure,
    step_pause,
    step_pauses,
)
from ledger.services.hostloss import (
    HOST_GONE_ERROR,
    runs_end_of_instances,
    runs_end_on_gone_hosts,
    runs_end_on_host,
)
from ledger.services.loops import (
    LOOP_ACTIONS,
    LoopChange,
    loop_status_change,
)
from ledger.services.notifications import notify
from ledger.services.recovery import (
    RecoveredRun,
    run_work_saved,
    runs_fail_unserved,
    runs_queued_stale,
    runs_recover_expired,
)
from ledger.services.runs import (
    run_cancel,
    run_claim,
    run_commit_failed,
    run_commit_record,
    run_finalize,
    run_lease_renew,
    run_park,
    run_resume,
    run_worktree_record,
    run_worktree_removed,
)
from ledger.services.steps import (
    RunEnd,
    StepResult,
    StepStart,
    step_complete,
    step_finish,
    step_output_record,
    step_process_record,
    step_skip,
    step_start,
)
from ledger.services.work_items import (
    AdmitRows,
    join_reason,
    run_retry_item,
    work_item_admit,
    work_item_admit_rows,
    work_item_cancel,
    work_item_dead_letter,
    work_item_requeue,
)

__all__ = [
    "HOST_GONE_ERROR",
    "runs_end_of_instances",
    "runs_end_on_gone_hosts",
    "runs_end_on_host",
    "CANCEL_REASON_DEFAULT",
    "CANCELLABLE_STATUSES",
    "DEAD_LETTERABLE_STATUSES",
    "REQUEUEABLE_STATUSES",
    "RUN_NOT_FOUND",
    "RUN_NOT_QUEUED",
    "AdmitRows",
    "LedgerError",
    "NotFound",
    "AccountError",
    "LOOP_ACTIONS",
    "LoopChange",
    "RecoveredRun",
    "account_add",
    "account_edit",
    "account_window_budgets",
    "login_environment",
    "account_env_parse",
    "account_remove",
    "account_set_enabled",
    "RunEnd",
    "StepResult",
    "StepStart",
    "account_cooldown_record",
    "account_cooldown_report",
    "account_login_failed_report",
    "Report",
    "account_login_clear",
    "account_clear",
    "Cleared",
    "account_login_failed_record",
    "account_unresponsive_record",
    "join_reason",
    "kill_step_process_group",
    "loop_status_change",
    "notify",
    "run_cancel",
    "run_claim",
    "run_commit_failed",
    "run_commit_record",
    "run_finalize",
    "run_lease_renew",
    "run_park",
    "run_resume",
    "run_retry_item",
    "run_worktree_record",
    "run_worktree_removed",
    "run_work_saved",
    "runs_fail_unserved",
    "runs_queued_stale",
    "runs_recover_expired",
    "step_complete",
    "step_finish",
    "step_move_after_failure",
    "step_pause",
    "step_pauses",
    "pool_member_left",
    "POOL_RATE_LIMITED_CODE",
    "POOL_WAIT_OVER_CODE",
    "run_pool",
    "step_output_record",
    "step_process_record",
    "step_skip",
    "step_spec",
    "step_start",
    "steps_from_spec",
    "work_item_admit",
    "work_item_admit_rows",
    "work_item_cancel",
    "work_item_dead_letter",
    "work_item_requeue",
    "worker_identity",
]
