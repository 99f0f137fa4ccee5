"""Step runs: start (under the admission lock: account cap and cooldown checked from the
rows), the process record, finish, skip.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents.usage import Usage
from domain import reasons
from domain.pool import LOGIN_FAILED_REASON, UNRESPONSIVE_REASON
from domain.revisions import Verdict
from ledger.claims import TASK_PARKED, task_hold
from ledger.lock import admission_lock
from ledger.models import (
    RunStatus,
    StepReasonCode,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
)
from ledger.selectors import AccountGate, RegisteredAccount, account_gate
from ledger.services.account_loads import apply_load_delta, load_change, run_load
from ledger.services.attempts import (
    ATTEMPT_LOGIN_FAILED,
    ATTEMPT_RATE_LIMITED,
    ATTEMPT_UNRESPONSIVE,
    attempt_close,
    attempt_open,
)
from ledger.services.cascade import end_run
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
    append_event,
    clean_text,
    events_in_one_statement,
    last_event_is,
    lease_duration,
    lock_step,
    now_or_default,
    step_spec,
    to_ms,
)
from ledger.services.failover import (
    account_limit,
    pool_wait,
    role_excluded,
    role_refusal,
    run_pool,
    step_failover,
)
from ledger.windows import window_refusal

WAIT_DISABLED = "account {profile} is disabled in the account registry"


@dataclass(frozen=True)
class StepStart:
    """The outcome of `step_start`: started, or refused with why and when to look again.

    `account` is the registry row of the step's account as the start read it (None when the
    step has no account or it is unregistered), for the agent's environment.
    """

    started: bool
    step_run: WorkflowStepRun
    wait_reason: str | None = None
    wait_code: str | None = None
    retry_at: datetime | None = None
    account: RegisteredAccount | None = None


@dataclass(frozen=True)
class StepResult:
    """How a step's process ended, as the runner records it (`step_finish` fields)."""

    status: str
    exit_code: int | None = None
    pid: int | None = None
    duration_ms: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    error: str | None = None
    usage: Usage | None = None
    processes_ended: int | None = None  # left running, ended by the step guard
    # host:port -> connections the sandbox's egress relay refused (agents.egress)
    egress_refused: dict[str, int] | None = None
    rate_limited: bool = False  # the agent reported a provider rate limit
    login_failed: bool = False  # the agent named an authentication error
    unresponsive: bool = False  # the agent made no progress for its idle limit (a hang)
    # A verifier's verdict from its last message (domain.revisions), None for other steps.
    verdict: Verdict | None = None

    def reason_code(self) -> str:
        """The step's stored `reason_code` (StepReasonCode) for this ending."""
        if self.status == StepStatus.SUCCEEDED:
            return StepReasonCode.NONE
        if self.rate_limited:
            return StepReasonCode.RATE_LIMITED
        if self.login_failed:
            return StepReasonCode.LOGIN_FAILED
        return StepReasonCode.FAILED

    def attempt_status(self) -> str | None:
        """How its attempt closes when its account failed it (ledger.services.attempts),
        None: as the step's status."""
        if self.status == StepStatus.SUCCEEDED:
            return None
        if self.rate_limited:
            return ATTEMPT_RATE_LIMITED
        if self.login_failed:
            return ATTEMPT_LOGIN_FAILED
        return ATTEMPT_UNRESPONSIVE if self.unresponsive else None


@dataclass(frozen=True)
class RunEnd:
    """The run ends with the step just finished: its other open steps are skipped (with
    `skip_reason`), then the run gets `status` and `error`."""

    status: str
    error: str | None = None
    skip_reason: str | None = None


def step_start(
    *, step_run_id: str, worker: str, now: datetime | None = None
) -> StepStart:
    """Move a step run to `running`, unless its account is full or cooling.

    1. Takes the admission lock first (docs/design.md, "one admission lock"): the account check
       and the start are one decision, serialised with admissions and every other step start.
    2. The run must be `running` and claimed by `worker`; the step must be pending (or
       failed/timed_out, upstream's retry states). Otherwise `STEP_NOT_CLAIMABLE`.
    3. Account re-check, when the step has an account_profile: disabled in the account
       registry, or its login failed (`account check` clears that) → refused; cooling now → refused (`retry_at` = when it frees);
       in a pool-routed run, a rate-limit window spent (ledger.windows: `window_exhausted`,
       `retry_at` = its reset) → refused; running steps
       on the account (other than this one) >= the stricter of the step's
       `routing.maxPerProfile` and the account's `max_running` → refused. Before refusing,
       a step of a pool-routed run moves to a free pool member (ledger.services.failover:
       attribution rewritten, event `step_account_moved`) and starts there; when every
       member of its pool is cooling, the refusal says so and waits for the earliest end
       (or says the wait is over, `pool_wait_over`: ledger/services/failover.py, "a
       whole-pool limit waits"). Worker ≠ verifier (ledger/services/failover.py, "worker ≠
       verifier"): in a pool-routed run, a worker or verifier step whose account the
       other role started on is refused (`role_conflict`) and moves; when the only free
       member is the other role's, it waits as the whole pool's cooldown does ("a whole-pool
       limit waits"). A refusal records one `step_waiting` event per distinct reason and renews
       the run's lease; the runner retries.
    4. Started: started_at = now, finish fields and output cleared, an attempt opened on
       the account (ledger.services.attempts), event `step_started` with the account.
    """
    now = now_or_default(now)
    with transaction.atomic(), events_in_one_statement():
        admission_lock()
        run, step, steps = lock_step(step_run_id)
        before = run_load(run.status, steps)
        outcome = _start_locked(run, step, steps, worker=worker, now=now, own=True)
        apply_load_delta(load_change(before, run_load(run.status, steps)))
    return outcome


def step_complete(
    *,
    step_run_id: str,
    worker: str,
    result: StepResult | None,
    start_next: str | None = None,
    end: RunEnd | None = None,
    now: datetime | None = None,
) -> StepStart | None:
    """Finish a running step (`result`; None when it is finished already) and, in the same
    transaction, go on: start the run's next step (`start_next`, a step run id: the outcome
    of that start is returned, as from `step_start`; a refused start leaves that step
    pending and the finish stands) or end the run (`end`: its other open steps skipped,
    then the run ended as `run_finalize` ends it).

    One lock hold, one read of the run and its steps, one account-load update and one
    statement for all the events, instead of a transaction for each. The run must be
    `running` and claimed by `worker` (else `LedgerError`, and nothing is written).
    """
    now = now_or_default(now)
    with transaction.atomic(), events_in_one_statement():
        admission_lock()
        run, step, steps = lock_step(step_run_id, with_item=end is not None)
        if run.status != RunStatus.RUNNING or run.claimed_by != worker:
            raise LedgerError(
                STEP_NOT_RUNNING.format(
                    run_id=run.id,
                    step_id=step.step_id,
                    status=f"{step.status} (run {run.status})",
                )
            )
        before = run_load(run.status, steps)
        if result is not None:
            _finish_locked(run, step, steps, result, now=now)
        outcome = None
        if start_next is not None:
            following = next(s for s in steps if s.pk == start_next)
            outcome = _start_locked(run, following, steps, worker=worker, now=now)
        if end is not None:
            for other in steps:
                if other.status in OPEN_STEP_STATUSES:
                    _skip_locked(run, other, end.skip_reason)
            end_run(
                run,
                status=end.status,
                error=end.error,
                item_reason=end.error,
                now=now,
                steps=steps,
            )
        apply_load_delta(load_change(before, run_load(run.status, steps)))
    return outcome


def _start_locked(
    run: WorkflowRun,
    step: WorkflowStepRun,
    steps: list[WorkflowStepRun],
    *,
    worker: str,
    now: datetime,
    own: bool = False,
) -> StepStart:
    """`step_start` on rows the caller locked; the caller applies the load change. `own`:
    a start of its own (`step_start`), which reads the task's hold; a start made by the
    transaction that finished the step before it follows a step that ran, so no hold of
    its task is in force (a held step starts again through `step_start`)."""
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
    gate, refusal = _start_refusal(run, step, steps, now, held=own)
    if refusal is not None:
        code, reason, retry_at = refusal
        # The wait renews the lease (a started step's process renews it as it runs).
        run.lease_expires_at = now + lease_duration()
        WorkflowRun.objects.filter(pk=run.id).update(
            lease_expires_at=run.lease_expires_at, updated_at=now
        )
        if not last_event_is(run.id, "step_waiting", step_id=step.step_id, code=code):
            append_event(
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
    step.reason_code = StepReasonCode.NONE
    step.progress_at = None
    step.save()
    attempt_open(step, now=now)
    append_event(
        run.id,
        "step_started",
        step_id=step.step_id,
        payload={
            "accountProfile": step.account_profile,
            "accountTool": step.account_tool,
        },
    )
    return StepStart(
        started=True, step_run=step, account=gate.account if gate else None
    )


def _start_refusal(
    run: WorkflowRun,
    step: WorkflowStepRun,
    steps: list[WorkflowStepRun],
    now: datetime,
    *,
    held: bool,
) -> tuple[AccountGate | None, tuple[str, str, datetime | None] | None]:
    """Whether the step may start now (`step_start`, "account re-check"): its account's gate
    and the refusal, None when it may. With `held`, a task held after a rate limit
    (ledger/claims.py, "the bound") waits first, on no account at all."""
    hold = task_hold(run, now) if held else None
    if hold is not None:
        return None, (TASK_PARKED, hold[0], hold[1])
    spec = step_spec(run, step.step_id)
    gate = _account_gate(step, now)
    # Spent windows refuse only where the step can move (a pool-routed run): a pinned
    # account's step runs and meets the provider's own answer.
    pooled = run_pool(run) is not None
    # Worker ≠ verifier (ledger/services/failover.py, "worker ≠ verifier"): an account the
    # run's other role started on refuses this step as a cooling one does, so it moves or
    # waits.
    excluded = role_excluded(run, step, steps) if pooled else {}
    refusal = role_refusal(step, excluded) or _account_refusal(
        step, spec, gate, now if pooled else None
    )
    if refusal is not None and step_failover(
        run=run,
        step=step,
        steps=steps,
        code=refusal[0],
        reason=refusal[1],
        now=now,
    ):
        gate = _account_gate(step, now)
        refusal = _account_refusal(step, spec, gate, now if pooled else None)
    if refusal is not None and pooled:
        refusal = pool_wait(run, step, refusal, excluded, now)
    return gate, refusal


def _account_gate(step: WorkflowStepRun, now: datetime) -> AccountGate | None:
    return account_gate(step.account_profile, now=now) if step.account_profile else None


def _account_refusal(
    step: WorkflowStepRun,
    spec: dict[str, Any],
    gate: AccountGate | None,
    windows_at: datetime | None,
) -> tuple[str, str, datetime | None] | None:
    if gate is None:
        return None
    profile = step.account_profile
    account = gate.account
    if account is not None and not account.enabled:
        return (reasons.ACCOUNT_DISABLED, WAIT_DISABLED.format(profile=profile), None)
    if account is not None and account.login_failed:
        return (
            reasons.LOGIN_FAILED,
            LOGIN_FAILED_REASON.format(name=profile),
            None,
        )
    if (
        account is not None
        and windows_at is not None  # as spent windows: only where the step can move
        and account.unresponsive_at(windows_at)
    ):
        return (
            reasons.UNRESPONSIVE,
            UNRESPONSIVE_REASON.format(name=profile),
            account.unresponsive_until,
        )
    if gate.cooling_until is not None:
        return (
            "cooldown",
            WAIT_COOLING.format(profile=profile, until=gate.cooling_until.isoformat()),
            gate.cooling_until,
        )
    spent = (
        window_refusal(profile, spec, windows_at, gate.running)
        if profile and windows_at is not None
        else None
    )
    if spent is not None:
        return spent
    limit = account_limit(spec, account)
    # The kept count of running steps on the account: this step is not one of them (it is
    # pending, or failed/timed_out before a retry).
    if limit is not None and gate.running >= limit:
        return (
            "profile_cap",
            WAIT_AT_CAPACITY.format(profile=profile, running=gate.running, limit=limit),
            None,
        )
    return None


def step_process_record(*, step_run_id: str, pid: int) -> None:
    """Record the pid of a running step's process (its process group id too)."""
    # One statement, in autocommit: no transaction of its own needed.
    WorkflowStepRun.objects.filter(pk=step_run_id, status=StepStatus.RUNNING).update(
        pid=pid, updated_at=timezone.now()
    )


def step_output_record(
    *,
    step_run_id: str,
    stdout: str,
    stderr: str,
    running_only: bool = True,
    progress_at: datetime | None = None,
) -> bool:
    """Write a step's output tails so far (while it runs, or kept after its run was taken
    away), and when given, the time its agent last made progress. One statement, in
    autocommit; True when the row was written."""
    rows = WorkflowStepRun.objects.filter(pk=step_run_id)
    if running_only:
        rows = rows.filter(status=StepStatus.RUNNING)
    fields: dict[str, Any] = {"progress_at": progress_at} if progress_at else {}
    return bool(
        rows.update(
            stdout=clean_text(stdout),
            stderr=clean_text(stderr),
            updated_at=timezone.now(),
            **fields,
        )
    )


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
    """Finish a running step: succeeded, failed or timed_out (docs/upstream.md §2.3).

    Only from `running` (else `STEP_NOT_RUNNING`, e.g. after recovery or cancel took the
    run). Records the exit code, pid, duration, output tails and error; event
    `step_<status>`. The pid is kept as a record (upstream clears it); recovery only looks
    at running steps, so a finished step's pid is never signalled. (The runner uses
    `step_complete`, which also starts the next step or ends the run.)
    """
    result = StepResult(
        status=status,
        exit_code=exit_code,
        pid=pid,
        duration_ms=duration_ms,
        stdout=stdout,
        stderr=stderr,
        error=error,
        usage=usage,
    )
    now = now_or_default(now)
    with transaction.atomic():
        run, step, steps = lock_step(step_run_id)
        before = run_load(run.status, steps)
        _finish_locked(run, step, steps, result, now=now)
        apply_load_delta(load_change(before, run_load(run.status, steps)))
    return step


def _finish_locked(
    run: WorkflowRun,
    step: WorkflowStepRun,
    steps: list[WorkflowStepRun],
    result: StepResult,
    *,
    now: datetime,
) -> None:
    """`step_finish` on rows the caller locked; the caller applies the load change."""
    if result.status not in STEP_FINAL_STATUSES:
        raise LedgerError(STEP_STATUS_NOT_FINAL.format(status=result.status))
    if step.status != StepStatus.RUNNING or run.status != RunStatus.RUNNING:
        raise LedgerError(
            STEP_NOT_RUNNING.format(
                run_id=run.id, step_id=step.step_id, status=step.status
            )
        )
    usage = result.usage
    step.status = result.status
    step.finished_at = now
    step.exit_code = result.exit_code
    step.pid = result.pid if result.pid is not None else step.pid
    step.duration_ms = (
        result.duration_ms
        if result.duration_ms is not None
        else (to_ms(now - step.started_at) if step.started_at else None)
    )
    step.stdout = clean_text(result.stdout)
    step.stderr = clean_text(result.stderr)
    step.error = clean_text(result.error)
    step.reason_code = result.reason_code()
    step.usage_input_tokens = usage.input_tokens if usage else None
    step.usage_output_tokens = usage.output_tokens if usage else None
    step.usage_cached_tokens = usage.cached_tokens if usage else None
    step.usage_cost_usd = usage.cost_usd if usage else None
    step.processes_ended = result.processes_ended
    step.egress_refused = result.egress_refused or None
    if result.verdict is not None:
        step.verdict = result.verdict.verdict
        step.verdict_text = clean_text(result.verdict.text) or None
    step.save()
    attempt_close(step, now=now, status=result.attempt_status())
    append_event(
        run.id,
        f"step_{result.status}",
        step_id=step.step_id,
        payload={
            "exitCode": result.exit_code,
            "durationMs": step.duration_ms,
            **({"error": step.error} if step.error else {}),
            **({"processesEnded": n} if (n := result.processes_ended) else {}),
            **({"egressRefused": r} if (r := result.egress_refused) else {}),
            **({"verdict": v.verdict} if (v := result.verdict) else {}),
        },
    )


def step_skip(
    *, step_run_id: str, reason: str | None = None, now: datetime | None = None
) -> WorkflowStepRun:
    """Skip a pending (or running) step, e.g. after an earlier step failed; event `step_skipped`."""
    now = now_or_default(now)
    with transaction.atomic():
        run, step, steps = lock_step(step_run_id)
        before = run_load(run.status, steps)
        _skip_locked(run, step, reason)
        apply_load_delta(load_change(before, run_load(run.status, steps)))
    return step


def _skip_locked(run: WorkflowRun, step: WorkflowStepRun, reason: str | None) -> None:
    if step.status not in OPEN_STEP_STATUSES or run.status != RunStatus.RUNNING:
        raise LedgerError(
            STEP_NOT_CLAIMABLE.format(
                run_id=run.id, step_id=step.step_id, status=step.status
            )
        )
    was_running = step.status == StepStatus.RUNNING
    step.status = StepStatus.SKIPPED
    step.error = clean_text(reason)
    step.save(update_fields=["status", "error", "updated_at"])
    if was_running:
        attempt_close(step, now=timezone.now())
    append_event(
        run.id,
        "step_skipped",
        step_id=step.step_id,
        payload={"reason": reason} if reason else None,
    )
