"""One started step as a process (runs/runner.py, "run the process" and "record the step"):
its invocation (the agent's target checked again and moved into the run's worktree, or a
command), the process under its watch (runs.agent_step), and what it said about its account:
a provider rate limit puts the account in cooldown, an authentication error marks its login
failed, a hang (no progress for the idle limit) marks it unresponsive; `account_failure`
tells the runner which, so it moves the step to another pool account
(ledger/services/failover.py, "an account's failure moves the step")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from agents.agent_message import final_message, speaks_json
from agents.ratelimit import (
    RateLimitSignal,
    detect_login_failure,
    detect_rate_limit,
    strip_ansi,
)
from agents.usage import Usage, parse_usage
from domain.errors import ValidationError
from domain.revisions import Verdict, parse_verdict
from domain.sandbox import step_isolation
from domain.templates import VERIFIER, WORKER, step_role
from ledger import services
from ledger.claims import confirm_enqueue
from ledger.dberrors import write_ledger
from ledger.held_secrets import held_secrets
from ledger.models import StepStatus, WorkflowRun, WorkflowStepRun
from ledger.services.failover import (
    LOGIN_FAILED_CODE,
    RATE_LIMIT_CODE,
    UNRESPONSIVE_CODE,
)
from runs.agent_step import StepWatch, step_limits
from runs.processes import Limits, ProcessResult
from runs.projects import project_dir_check
from runs.providers import (
    Invocation,
    ProviderError,
    agent_invocation,
    command_invocation,
    rate_limit_exit_codes,
)
from runs.run_signals import LeaseLost
from runs.sandbox import StepSandbox, sandbox_on, sandbox_problem, step_sandbox
from runs.worktrees import Worktree

STEP_KIND_UNKNOWN = "unknown step kind: {kind}"
RATE_LIMIT_NOTE = "; provider rate limit: {snippet}"
COOLDOWN_REASON = "{provider} rate limit on step {step_id} of run {run_id}: {snippet}"
UNRESPONSIVE_REASON = "step {step_id} of run {run_id} hung: {error}"


class StepProcess:
    """Runs a run's started steps as processes; `execute(start, spec)` returns the step's
    result, not yet recorded, and `rate_limited` the rate-limit snippet of that attempt."""

    def __init__(
        self,
        run: WorkflowRun,
        worktree: Callable[[], Worktree | None],
        keep_alive: Callable[[], bool],
        keep_alive_every: float,
        deadline: float | None,
    ) -> None:
        self.run = run
        self._worktree = worktree  # the run's, once it is prepared
        self.keep_alive = keep_alive
        self.keep_alive_every = keep_alive_every
        self.deadline = deadline  # the task's (runs.agent_step.task_deadline)
        self.rate_limited: str | None = None
        # How the last attempt's account failed it (None: it did not), for the runner's move.
        self.account_failure: AccountFailure | None = None
        # Set when the task's bound refused to mark this attempt's account (ledger.claims):
        # the task parks with this reason instead of trying another account.
        self.parked: str | None = None
        self.held = False  # a parked task that waits (ledger/claims.py, "the bound")
        # A per-minute 429 (a reset at most LOOPSWEB_THROTTLE_SECONDS off): the account
        # pauses until then and the step stays on it.
        self.paused_until: datetime | None = None
        # What a revision round's worker is told after the task (runs.revision_run).
        self.worker_extra: str | None = None
        # The verifier's verdict as its step ended here: (step id, verdict).
        self.verdict: tuple[str, Verdict] | None = None

    @property
    def worktree(self) -> Worktree | None:
        return self._worktree()

    def execute(
        self, start: services.StepStart, spec: Mapping[str, Any]
    ) -> services.StepResult:
        """Run a started step's process; its result, not yet recorded."""
        self.rate_limited = None
        self.account_failure = None
        self.parked = None
        self.held = False
        self.paused_until = None
        step = start.step_run
        target = found if isinstance(found := spec.get("target"), dict) else {}
        kind = target.get("type") or spec.get("kind")
        is_agent = kind == "agent"
        try:
            target, invocation = self._invocation(start, spec, target, kind)
        except (ProviderError, ValidationError) as exc:
            return services.StepResult(status=StepStatus.FAILED, error=str(exc))
        # Whatever the step prints, no secret loopsweb holds is stored (ledger.held_secrets).
        invocation.secrets = invocation.secrets.with_secrets(held_secrets())
        timeout_ms, idle_ms = step_limits(spec, target, is_agent=is_agent)
        provider = invocation.provider
        watch = StepWatch(
            step.id,
            provider,
            is_agent=is_agent,
            account=step.account_profile,
            on_spawn=lambda pid: write_ledger(
                f"run {self.run.id}: the process of step {step.step_id}",
                lambda: services.step_process_record(step_run_id=step.id, pid=pid),
            ),
            keep_alive=self.keep_alive,
        )
        limits = Limits(
            timeout_seconds=timeout_ms / 1000 if timeout_ms else None,
            idle_timeout_seconds=idle_ms / 1000 if idle_ms else None,
            tail_bytes=int(settings.LOOPSWEB_OUTPUT_TAIL_BYTES),
            grace_seconds=float(settings.LOOPSWEB_KILL_GRACE_SECONDS),
            keep_alive_every=self.keep_alive_every,
            deadline=self.deadline,
            output_every=float(settings.LOOPSWEB_OUTPUT_FLUSH_SECONDS),
        )
        try:
            # redacts the step's secrets (runs.agent_step)
            result = watch.run(invocation=invocation, limits=limits)
        finally:
            invocation.remove_files()
        if result.lost:
            watch.keep(result.stdout, result.stderr)
            raise LeaseLost()
        if result.spawn_error:
            return _step_result(result, StepStatus.FAILED, error=result.spawn_error)
        status, error = watch.outcome(result, timeout_ms=timeout_ms, idle_ms=idle_ms)
        usage = None
        note = None
        login_failed = unresponsive = False
        if is_agent and result.timeout is None:
            note = self._record_rate_limit(step, provider, result, watch.signal)
            if note and error:
                error += note
            elif status != StepStatus.SUCCEEDED:
                login_failed = self._record_login_failure(step, result, error)
        elif is_agent and result.timeout == "idle":
            unresponsive = True
            self._record_unresponsive(step, error or "")
        if is_agent:
            usage = parse_usage(provider, result.stdout)
        done = _step_result(
            result,
            status,
            error=error,
            usage=usage,
            rate_limited=note is not None and status != StepStatus.SUCCEEDED,
            login_failed=login_failed,
            unresponsive=unresponsive,
        )
        if is_agent and status == StepStatus.SUCCEEDED:
            done = self._with_verdict(done, step.step_id, spec, provider)
        self.account_failure = _account_failure(done, self.rate_limited)
        return done

    def _with_verdict(
        self,
        done: services.StepResult,
        step_id: str,
        spec: Mapping[str, Any],
        provider: str | None,
    ) -> services.StepResult:
        """A verifier's result with its verdict, from its own last message
        (domain.revisions, "the verdict"), kept for the run's end (`verdict`); any other
        step's as it is."""
        if step_role(spec) != VERIFIER:
            return done
        # A plain-text CLI's last paragraph may hold the verdict line without the findings
        # after it (or the findings without the line): its whole output tail is its message.
        said = (
            final_message(provider, done.stdout)
            if speaks_json(provider)
            else strip_ansi(done.stdout or "")
        )
        done = replace(done, verdict=parse_verdict(said))
        assert done.verdict is not None
        self.verdict = (step_id, done.verdict)
        return done

    def _invocation(
        self,
        start: services.StepStart,
        spec: Mapping[str, Any],
        target: dict[str, Any],
        kind: object,
    ) -> tuple[dict[str, Any], Invocation]:
        """The step's target as it runs and its invocation (ProviderError, ValidationError
        when it cannot run)."""
        step = start.step_run
        if kind == "agent":
            target = self._isolated_target(spec)
            invocation = agent_invocation(
                target=target,
                profile=step.account_profile or target.get("authProfile"),
                tool=step.account_tool,
                run_id=self.run.id,
                step_id=step.step_id,
                # The start read the account's registry row; no second read.
                registry=(
                    {step.account_profile: start.account} if start.account else {}
                )
                if step.account_profile
                else None,
            )
            invocation.sandbox = self._sandbox(invocation)
            return target, invocation
        if kind == "command":
            return target, command_invocation(
                target=target, run_id=self.run.id, step_id=step.step_id
            )
        raise ProviderError(STEP_KIND_UNKNOWN.format(kind=kind))

    def _sandbox(self, invocation: Invocation) -> StepSandbox | None:
        """The agent step's sandbox (runs.sandbox), None when the operator turned it off;
        ProviderError when it cannot run here."""
        if not sandbox_on():
            return None
        problem = sandbox_problem()
        if problem is not None:
            raise ProviderError(problem)
        worktree = self.worktree
        return step_sandbox(
            provider=invocation.provider or "",
            binary=invocation.argv[0],
            root=worktree.path if worktree is not None else str(invocation.cwd),
            common_dir=worktree.common_dir if worktree is not None else None,
            account_env=invocation.account_env,
            extra_read_only=[str(path) for path in invocation.cleanup],
        )

    def _isolated_target(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """An agent step's target as it runs: checked again, and moved into the worktree."""
        target = dict(spec.get("target") or {})
        cwd = target.get("cwd")
        if isinstance(cwd, str) and cwd:
            project_dir_check(cwd)
            if self.worktree is not None:
                target["cwd"] = self.worktree.translate(cwd)
        prompt = target.get("prompt")
        if self.worker_extra and step_role(spec) == WORKER and isinstance(prompt, str):
            target["prompt"] = prompt + "\n" + self.worker_extra
        if "worktreeMode" in target:
            # Generated steps passed the preflight at admission against the worktree they
            # expected; the run may not have got one (the project stopped being a git tree).
            step_isolation(spec, worktree=self.worktree is not None)
        return target

    def _record_rate_limit(
        self,
        step: WorkflowStepRun,
        provider: str | None,
        result: ProcessResult,
        live: RateLimitSignal | None = None,
    ) -> str | None:
        signal_seen = live or detect_rate_limit(
            output=f"{result.stdout}\n{result.stderr}",
            exit_code=result.exit_code,
            rate_limit_exit_codes=rate_limit_exit_codes(provider),
            now=timezone.now(),
        )
        if signal_seen is None:
            return None
        self.rate_limited = signal_seen.snippet
        self.paused_until = _pause_end(signal_seen.until)
        if step.account_profile:
            # Recorded before the step is finished, so no other step can start on the
            # account in between and hit the same limit.
            # Bounded per task, 15 minutes unless confirmed (ledger.claims).
            self._reported(
                write_ledger(
                    f"run {self.run.id}: the cooldown of account {step.account_profile}",
                    lambda: services.account_cooldown_report(
                        step_run=step,
                        tool=step.account_tool or provider,
                        until=signal_seen.until,
                        reason=COOLDOWN_REASON.format(
                            provider=provider,
                            step_id=step.step_id,
                            run_id=self.run.id,
                            snippet=signal_seen.snippet,
                        ),
                    ),
                ),
                step,
            )
        return RATE_LIMIT_NOTE.format(snippet=signal_seen.snippet)

    def _record_login_failure(
        self, step: WorkflowStepRun, result: ProcessResult, error: str | None
    ) -> bool:
        """A failed step whose agent names an authentication error marks its account
        `login failed` with the agent's words (ledger.services.cooldowns): pool
        assignment and failover skip it until `account check` or `account enable`.
        True when the agent named one (the step's reason_code)."""
        signal = detect_login_failure(
            output=f"{result.stdout}\n{result.stderr}", exit_code=result.exit_code
        )
        profile = step.account_profile
        if signal is None:
            return False
        if not profile:
            return True
        # Bounded per task (ledger.claims): a second account is not marked.
        self._reported(
            write_ledger(
                f"run {self.run.id}: the login failure of account {profile}",
                lambda: services.account_login_failed_report(
                    step_run=step, reason=error or signal.snippet
                ),
            ),
            step,
        )
        return True

    def _record_unresponsive(self, step: WorkflowStepRun, error: str) -> None:
        """An agent step that made no progress for its idle limit (a hang) marks its
        account `unresponsive` for LOOPSWEB_UNRESPONSIVE_SECONDS (ledger.services.cooldowns):
        pool assignment, step starts and failover skip it until then."""
        profile = step.account_profile
        if not profile:
            return
        write_ledger(
            f"run {self.run.id}: the hang of account {profile}",
            lambda: services.account_unresponsive_record(
                profile=profile,
                reason=UNRESPONSIVE_REASON.format(
                    step_id=step.step_id, run_id=self.run.id, error=error
                ),
            ),
        )

    def _reported(self, report: services.Report, step: WorkflowStepRun) -> None:
        """What the task's bound decided: parked (no other account is tried), or a claim
        longer than 15 minutes, whose confirmation is queued (ledger.claims)."""
        if report.parked is not None:
            self.parked = report.parked
            self.held = report.held
        if report.claim is not None:
            confirm_enqueue(report.claim, step_run_id=step.id)


def _step_result(
    result: ProcessResult,
    status: str,
    *,
    error: str | None,
    usage: Usage | None = None,
    rate_limited: bool = False,
    login_failed: bool = False,
    unresponsive: bool = False,
) -> services.StepResult:
    return services.StepResult(
        status=status,
        exit_code=result.exit_code,
        pid=result.pid,
        duration_ms=result.duration_ms,
        stdout=result.stdout,
        stderr=result.stderr,
        error=error,
        usage=usage,
        processes_ended=result.ended if result.pid is not None else None,
        egress_refused=result.egress_refused,
        rate_limited=rate_limited,
        login_failed=login_failed,
        unresponsive=unresponsive,
    )


@dataclass(frozen=True)
class AccountFailure:
    """An attempt that failed because of its account: the `step_account_moved` code
    (ledger.services.failover) and the reason the move records."""

    code: str
    reason: str


def _pause_end(until: datetime | None) -> datetime | None:
    """The end of a per-minute limit's pause: a named reset at most LOOPSWEB_THROTTLE_SECONDS
    off; None for a longer one or none named (an exhausted window: the step moves)."""
    bound = int(settings.LOOPSWEB_THROTTLE_SECONDS)
    if until is None or bound <= 0:
        return None
    return until if until <= timezone.now() + timedelta(seconds=bound) else None


def _account_failure(
    result: services.StepResult, rate_limit: str | None
) -> AccountFailure | None:
    if result.status == StepStatus.SUCCEEDED:
        return None
    if result.rate_limited and rate_limit is not None:
        return AccountFailure(RATE_LIMIT_CODE, rate_limit)
    if result.login_failed:
        return AccountFailure(LOGIN_FAILED_CODE, result.error or LOGIN_FAILED_CODE)
    if result.unresponsive:
        return AccountFailure(UNRESPONSIVE_CODE, result.error or UNRESPONSIVE_CODE)
    return None
