"""Step attempts: one row per try of a step on an account (ledger.models.WorkflowStepAttempt).

A step's start opens an attempt (running, on the account the step starts on); whatever ends
the step closes it with the step's outcome: its finish (succeeded, failed, timed_out, or
when its account failed it, `rate_limited` for a provider limit, `login_failed` for a
refused login, `unresponsive` for a hang: no progress for its idle limit), a skip of a
running step, or the run's end by cancel, recovery or timeout. A step that moves to another
account after such a failure and runs again opens a second attempt, so the failed account
and the time spent on it stay on record (the step run itself keeps only the last account);
a retry of the item leaves out the accounts of its `ACCOUNT_FAILURES` attempts.

Both writes are single statements inside the caller's transaction (the step's lock).
"""

from __future__ import annotations

from datetime import datetime

from ledger.models import WorkflowStepAttempt, WorkflowStepRun

ATTEMPT_RUNNING = "running"
ATTEMPT_RATE_LIMITED = "rate_limited"
ATTEMPT_LOGIN_FAILED = "login_failed"
ATTEMPT_UNRESPONSIVE = "unresponsive"
# The attempts that ended because of their account, not the task.
ACCOUNT_FAILURES = (ATTEMPT_RATE_LIMITED, ATTEMPT_LOGIN_FAILED, ATTEMPT_UNRESPONSIVE)


def attempt_open(step: WorkflowStepRun, *, now: datetime) -> None:
    """Record the start of a try of `step` on its current account."""
    WorkflowStepAttempt.objects.create(
        step_run_id=step.id,
        workflow_run_id=step.workflow_run_id,
        step_id=step.step_id,
        account_profile=step.account_profile,
        account_tool=step.account_tool,
        status=ATTEMPT_RUNNING,
        started_at=now,
    )


def attempt_close(
    step: WorkflowStepRun, *, now: datetime, status: str | None = None
) -> None:
    """Close the open attempt of `step` with what the step row now says of it (its status,
    duration, exit code, error and usage); `status` (one of ACCOUNT_FAILURES) says its
    account failed it."""
    WorkflowStepAttempt.objects.filter(
        step_run_id=step.id, finished_at__isnull=True
    ).update(
        status=status or step.status,
        finished_at=now,
        duration_ms=step.duration_ms,
        exit_code=step.exit_code,
        error=step.error,
        usage_input_tokens=step.usage_input_tokens,
        usage_output_tokens=step.usage_output_tokens,
        usage_cached_tokens=step.usage_cached_tokens,
        usage_cost_usd=step.usage_cost_usd,
    )
