"""Step runs: start (under the admission lock: account cap and cooldown checked from the
rows), the process record, finish, skip.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.loads import apply_load_delta, load_change, run_load
from ledger.lock import admission_lock
from ledger.models import (
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
)
from ledger.selectors import account_registry
from ledger.services.common import (
    OPEN_STEP_STATUSES,
    STEP_CLAIMABLE_STATUSES,
    STEP_FINAL_STATUSES,
    STEP_NOT_CLAIMABLE,
    STEP_NOT_RUNNING,
    STEP_STATUS_NOT_FINAL,
    WAIT_AT_CAPACITY,
    WAIT_COOLING,
    LedgerError,
    _append_event,
    _clean_text,
    _lease,
    _lock_step,
    _ms,
    _now,
    step_spec,
)
from ledger.services.failover import account_limit, step_failover
from ledger.usage import Usage
from routing.domain import reasons

WAIT_DISABLED = "account {profile} is disabled in the account registry"


@dataclass(frozen=True)
class StepStart:
    """The outcome of `step_start`: started, or refused with why and when to look again."""

    started: bool
    step_run: WorkflowStepRun
    wait_reason: str | None = None
    wait_code: str | None = None
    retry_at: datetime | None = None


def step_start(
    *, step_run_id: str, worker: str, now: datetime | None = None
) -> StepStart:
    """Move a step run to `running`, unless its account is full or cooling.

    1. Takes the admission lock first (DESIGN rule 2): the account check and the start are
       one decision, serialised with admissions and every other step start.
    2. The run must be `running` and claimed by `worker`; the step must be pending (or
       failed/timed_out, upstream's retry states). Otherwise `STEP_NOT_CLAIMABLE`.
    3. Account re-check, when the step has an account_profile: disabled in the account
       registry → refused; cooling now → refused (`retry_at` = when it frees); running steps
       on the account (other than this one) >= the stricter of the step's
       `routing.maxPerProfile` and the account's `max_running` → refused. Before refusing,
       a step of a pool-routed run moves to a free pool member (ledger.services.failover:
       attribution rewritten, event `step_account_moved`) and starts there. A refusal
       records one `step_waiting` event per distinct reason and renews the lease; the
       runner retries.
    4. Started: started_at = now, finish fields and output cleared, event `step_started`
       with the account, run lease renewed.
    """
    now = _now(now)
    with transaction.atomic():
        admission_lock()
        run, step, steps = _lock_step(step_run_id)
        before = run_load(run.status, steps)
        if (
            run.status != RunStatus.RUNNING
            or run.claimed_by != worker
            or step.status not in STEP_CLAIMABLE_STATUSES
        ):
            raise LedgerError(
                STEP_NOT_CLAIMABLE.format(
                    run_id=run.id,
                    step_id=step.step_id,
                    status=step.status
                    if run.status == RunStatus.RUNNING
                    else f"{step.status} (run {run.status})",
                )
            )
        run.lease_expires_at = now + _lease()
        WorkflowRun.objects.filter(pk=run.id).update(
            lease_expires_at=run.lease_expires_at, updated_at=now
        )
        spec = step_spec(run, step.step_id)
        refusal = _account_refusal(step, spec, now)
        if refusal is not None and step_failover(
            run=run,
            step=step,
            steps=steps,
            code=refusal[0],
            reason=refusal[1],
            now=now,
        ):
            before = run_load(run.status, steps)  # the move applied its own change
            refusal = _account_refusal(step, spec, now)
        if refusal is not None:
            code, reason, retry_at = refusal
            last = (
                WorkflowEvent.objects.filter(workflow_run_id=run.id)
                .order_by("-sequence")
                .first()
            )
            if not (
                last
                and last.event_type == "step_waiting"
                and last.step_id == step.step_id
                and (last.payload_json or {}).get("code") == code
            ):
                _append_event(
                    run.id,
                    "step_waiting",
                    step_id=step.step_id,
                    payload={"code": code, "reason": reason},
                )
            return StepStart(
                started=False,
                step_run=step,
                wait_reason=reason,
                wait_code=code,
                retry_at=retry_at,
            )
        step.status = StepStatus.RUNNING
        step.started_at = now
        step.finished_at = None
        step.exit_code = None
        step.pid = None
        step.duration_ms = None
        step.stdout = None
        step.stderr = None
        step.error = None
        step.save()
        apply_load_delta(load_change(before, run_load(run.status, steps)))
        _append_event(
            run.id,
            "step_started",
            step_id=step.step_id,
            payload={
                "accountProfile": step.account_profile,
                "accountTool": step.account_tool,
            },
        )
    return StepStart(started=True, step_run=step)


def _account_refusal(
    step: WorkflowStepRun, spec: dict[str, Any], now: datetime
) -> tuple[str, str, datetime | None] | None:
    profile = step.account_profile
    if not profile:
        return None
    account = account_registry([profile]).get(profile)
    if account is not None and not account.enabled:
        return (reasons.ACCOUNT_DISABLED, WAIT_DISABLED.format(profile=profile), None)
    cooldown = AccountCooldown.objects.filter(
        account_profile=profile, until__gt=now
    ).first()
    if cooldown is not None:
        return (
            "cooldown",
            WAIT_COOLING.format(profile=profile, until=cooldown.until.isoformat()),
            cooldown.until,
        )
    limit = account_limit(spec, account)
    if limit is None:
        return None
    running = (
        WorkflowStepRun.objects.filter(
            status=StepStatus.RUNNING, account_profile=profile
        )
        .exclude(pk=step.pk)
        .count()
    )
    if running >= limit:
        return (
            "profile_cap",
            WAIT_AT_CAPACITY.format(profile=profile, running=running, limit=limit),
            None,
        )
    return None


def step_process_record(*, step_run_id: str, pid: int) -> None:
    """Record the pid of a running step's process (its process group id too)."""
    with transaction.atomic():
        WorkflowStepRun.objects.filter(
            pk=step_run_id, status=StepStatus.RUNNING
        ).update(pid=pid, updated_at=timezone.now())


def step_finish(
    *,
    step_run_id: str,
    status: str,
    exit_code: int | None = None,
    pid: int | None = None,
    duration_ms: int | None = None,
    stdout: str | None = None,
    stderr: str | None = None,
    error: str | None = None,
    usage: Usage | None = None,
    now: datetime | None = None,
) -> WorkflowStepRun:
    """Finish a running step: succeeded, failed or timed_out (reference §2.3).

    Only from `running` (else `STEP_NOT_RUNNING`, e.g. after recovery or cancel took the
    run). Records the exit code, pid, duration, output tails and error; event
    `step_<status>`. The pid is kept as a record (upstream clears it); recovery only looks
    at running steps, so a finished step's pid is never signalled.
    """
    if status not in STEP_FINAL_STATUSES:
        raise LedgerError(STEP_STATUS_NOT_FINAL.format(status=status))
    now = _now(now)
    with transaction.atomic():
        run, step, steps = _lock_step(step_run_id)
        before = run_load(run.status, steps)
        if step.status != StepStatus.RUNNING or run.status != RunStatus.RUNNING:
            raise LedgerError(
                STEP_NOT_RUNNING.format(
                    run_id=run.id, step_id=step.step_id, status=step.status
                )
            )
        step.status = status
        step.finished_at = now
        step.exit_code = exit_code
        step.pid = pid if pid is not None else step.pid
        step.duration_ms = (
            duration_ms
            if duration_ms is not None
            else (_ms(now - step.started_at) if step.started_at else None)
        )
        step.stdout = _clean_text(stdout)
        step.stderr = _clean_text(stderr)
        step.error = _clean_text(error)
        step.usage_input_tokens = usage.input_tokens if usage else None
        step.usage_output_tokens = usage.output_tokens if usage else None
        step.usage_cached_tokens = usage.cached_tokens if usage else None
        step.usage_cost_usd = usage.cost_usd if usage else None
        step.save()
        apply_load_delta(load_change(before, run_load(run.status, steps)))
        _append_event(
            run.id,
            f"step_{status}",
            step_id=step.step_id,
            payload={
                "exitCode": exit_code,
                "durationMs": step.duration_ms,
                **({"error": step.error} if step.error else {}),
            },
        )
    return step


def step_skip(
    *, step_run_id: str, reason: str | None = None, now: datetime | None = None
) -> WorkflowStepRun:
    """Skip a pending (or running) step, e.g. after an earlier step failed; event `step_skipped`."""
    now = _now(now)
    with transaction.atomic():
        run, step, steps = _lock_step(step_run_id)
        before = run_load(run.status, steps)
        if step.status not in OPEN_STEP_STATUSES or run.status != RunStatus.RUNNING:
            raise LedgerError(
                STEP_NOT_CLAIMABLE.format(
                    run_id=run.id, step_id=step.step_id, status=step.status
                )
            )
        step.status = StepStatus.SKIPPED
        step.error = _clean_text(reason)
        step.save(update_fields=["status", "error", "updated_at"])
        apply_load_delta(load_change(before, run_load(run.status, steps)))
        _append_event(
            run.id,
            "step_skipped",
            step_id=step.step_id,
            payload={"reason": reason} if reason else None,
        )
    return step
