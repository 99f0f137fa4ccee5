"""A step's process as the runner supervises it: its time limits, its output while it runs,
a rate limit seen while it runs, and how it ended in words (docs/agents.md, "What the runner
calls").

- Time limits: `timeoutMs` / `idleTimeoutMs` of the step (its target's, or what its route's
  `--step-timeout` / `--step-idle-timeout` rendered into it); an agent step without them gets
  LOOPSWEB_STEP_TIMEOUT_SECONDS and LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS. A run executed by its
  django-q2 task also has the task's deadline: the runner stops the step
  `task_margin_seconds()` before Q_TIMEOUT would kill the worker, so the run ends as
  `timed_out` saying so, with the output seen so far and its work committed.
- `StepWatch`: the output tails written to the step run every LOOPSWEB_OUTPUT_FLUSH_SECONDS
  while there is new output (`runs.processes.run_process` calls it), and, for an agent,
  `agents.agent_output.live_rate_limit` on the output so far: a rate limit the agent hit but
  is still retrying stops it at once, with no kill grace (`STOP_GRACE_SECONDS`: the CLI is
  only waiting to try again), so the step moves to another account without waiting.
- Progress, not bytes: for a CLI whose stream tells progress apart (agents/agent_output.py,
  "progress"), the idle limit counts from its last model answer or tool call, so a CLI that
  only retries or logs errors is idle; the time of the last progress is written with the
  tails (`progress_at`, shown on /ops/). A CLI that reports LOOPSWEB_STEP_PROVIDER_ERRORS
  failed model calls in a row with no progress between them (agents/agent_output.py,
  "provider errors") is stopped, with the provider's error as the reason.
- `step_outcome`: status and error of a finished process; an agent's error is its own
  message with the exit code after it (`agents.agent_output.agent_error`). A hang reads the
  same for every CLI: "no progress for 10 min (idle limit)" and the last progress event.
- Windows: with the step's account, `runs.window_watch.WindowWatch` records the
  rate-limit windows the CLI reports, on every flush and when the process ends.
- No secret in the ledger: `StepWatch.run` runs the step's process and hands on its result
  with the step's secrets (`Invocation.secrets`: its account's env file values, variables
  whose names look secret; agents.redaction) replaced by `[redacted:NAME]`, and the live
  flushes and the live rate-limit check see the output redacted the same way. The tails,
  the error, the rate-limit snippet (cooldown reason, events) are all built from that.

No transaction here; `StepWatch.flush` is one autocommit statement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from agents.agent_output import (
    agent_error,
    knows_progress,
    line_progress,
    live_rate_limit,
    progress_summary,
    provider_error,
    summarize_output,
)
from agents.ratelimit import RateLimitSignal
from agents.redaction import Redactor
from ledger import services
from ledger.dberrors import OutageNotice, error_passes
from ledger.display import seconds
from ledger.models import StepStatus
from runs.processes import Limits, ProcessResult, ProcessWatch, run_process
from runs.providers import Invocation
from runs.window_watch import WindowWatch

logger = logging.getLogger(__name__)
# A step's output written while it runs: one line per outage (it is written again at the end).
_OUTPUT_NOTICE = OutageNotice("the output of running steps")

STEP_TIMED_OUT = "step timed out after {ms} ms"
STEP_IDLE_TIMED_OUT = "no progress for {duration} (idle limit)"
LAST_PROGRESS = "; last progress: {line}"
NO_PROGRESS = "; no progress since the step started"
STEP_PROVIDER_ERRORS = (
    "the provider failed {count} times in a row with no progress between: {error}"
)
STOP_PROVIDER_ERRORS = "provider-errors"
STEP_TASK_TIMED_OUT = (
    "Q_TIMEOUT reached: the run's task may last {seconds} s, so the runner stopped the "
    "step {margin} s before"
)
STEP_EXIT_CODE = "step exited with code {code}"
STEP_KILLED = "step was killed by signal {name}"
STEP_RATE_LIMITED = (
    "stopped: the agent hit a provider rate limit and was still retrying"
)
LAST_OUTPUT = "; last output: {line}"
STOP_RATE_LIMIT = "rate-limit"
# The grace of a step stopped because its provider refused it (a rate limit, provider errors
# in a row): the CLI is only waiting to try again, so it is killed at once and the step
# moves without waiting LOOPSWEB_KILL_GRACE_SECONDS (tests/bench/bench_failover_opencode.py).
STOP_GRACE_SECONDS = 0.0


def _positive_ms(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) and value > 0:
            return int(value)
    return None


def step_limits(
    spec: dict[str, Any] | Any, target: dict[str, Any] | Any, *, is_agent: bool
) -> tuple[int | None, int | None]:
    """(total, idle) time limits of a step in ms; an agent step always has both."""
    timeout_ms = _positive_ms(spec.get("timeoutMs"), target.get("timeoutMs"))
    idle_ms = _positive_ms(spec.get("idleTimeoutMs"), target.get("idleTimeoutMs"))
    if is_agent:
        timeout_ms = timeout_ms or int(settings.LOOPSWEB_STEP_TIMEOUT_SECONDS) * 1000
        idle_ms = idle_ms or int(settings.LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS) * 1000
    return timeout_ms, idle_ms


def task_margin_seconds() -> float:
    """How long before Q_TIMEOUT the runner stops its step: time to stop the process
    group, record the step and commit the run's work."""
    q_timeout = float(settings.Q_TIMEOUT)
    grace = float(settings.LOOPSWEB_KILL_GRACE_SECONDS)
    return min(q_timeout / 2, max(10.0, grace + 5.0, min(60.0, q_timeout * 0.05)))


def task_deadline(started: float) -> float:
    """The `time.monotonic()` value at which a task started at `started` stops its step."""
    return started + float(settings.Q_TIMEOUT) - task_margin_seconds()


class StepWatch(ProcessWatch):
    """What `run_process` tells while one step runs (runs.processes.ProcessWatch): the
    runner's `spawned` and `keep_alive` (when given) and this step's output; `run` runs it."""

    def __init__(
        self,
        step_run_id: str,
        provider: str | None,
        *,
        is_agent: bool,
        secrets: Redactor | None = None,
        account: str | None = None,
        on_spawn: Callable[[int], None] | None = None,
        keep_alive: Callable[[], bool] | None = None,
    ):
        self.step_run_id = step_run_id
        self.account = account
        self.windows: WindowWatch | None = None
        self.provider = provider
        self.is_agent = is_agent
        self.secrets = secrets or Redactor()
        self.on_spawn = on_spawn  # the runner's: records the pid
        self.renew = keep_alive  # the runner's: renews the run's lease
        self.signal: RateLimitSignal | None = None
        self.flushes = 0
        self.progress_line: str | None = None  # the last line that showed progress
        self.progress_at: datetime | None = None
        self.written_progress_at: datetime | None = None
        self.errors = 0  # provider errors since the last progress
        self.last_error: str | None = None

    @property
    def tracks_progress(self) -> bool:
        return self.is_agent and knows_progress(self.provider)

    def run(self, *, invocation: Invocation, limits: Limits) -> ProcessResult:
        """`run_process` under this watch, a step its provider refused stopped with no
        grace (`STOP_GRACE_SECONDS`); the result with the invocation's secrets redacted
        (module docstring), before anything records it."""
        self.secrets = invocation.secrets
        if self.is_agent and self.account:
            self.windows = WindowWatch(
                account=self.account,
                provider=self.provider,
                env=invocation.env,
                step_run_id=self.step_run_id,
            )
        result = run_process(
            invocation=invocation,
            limits=replace(limits, stop_grace_seconds=STOP_GRACE_SECONDS),
            watch=self,
        )
        result = self.redacted(result)
        if self.windows is not None:
            self.windows.seen(result.stdout)
        return result

    def spawned(self, pid: int) -> None:
        if self.on_spawn is not None:
            self.on_spawn(pid)

    def keep_alive(self) -> bool:
        return self.renew() if self.renew is not None else True

    def line(self, stream: str, text: str) -> bool:
        """One complete output line (runs.processes `on_line`): progress, a provider
        error, or neither."""
        if line_progress(self.provider, stream, text):
            self.progress_line = text
            self.progress_at = timezone.now()
            self.errors = 0
            return True
        error = provider_error(self.provider, stream, text)
        if error is not None:
            self.errors += 1
            self.last_error = error
        return False

    def redacted(self, result: ProcessResult) -> ProcessResult:
        """`result` with the step's secrets replaced by markers (agents.redaction)."""
        if not self.secrets:
            return result
        return replace(
            result,
            stdout=self.secrets.redact(result.stdout),
            stderr=self.secrets.redact(result.stderr),
            spawn_error=self.secrets.redact_optional(result.spawn_error),
        )

    def flush(self, stdout: str, stderr: str) -> None:
        try:
            progress_at = self.progress_at
            services.step_output_record(
                step_run_id=self.step_run_id,
                stdout=self.secrets.redact(stdout),
                stderr=self.secrets.redact(stderr),
                progress_at=progress_at
                if progress_at != self.written_progress_at
                else None,
            )
            self.written_progress_at = progress_at
            self.flushes += 1
            if self.windows is not None:
                self.windows.seen(self.secrets.redact(stdout))
            _OUTPUT_NOTICE.ok()
        except DatabaseError as exc:  # the output is written again when the step ends
            if not error_passes(exc):
                logger.exception(
                    "could not write the output of step %s", self.step_run_id
                )
                return
            _OUTPUT_NOTICE.failed(exc)

    def quiet(self, stdout: str) -> None:
        """No new output for a flush interval: a window the CLI wrote to a file meanwhile
        (codex's rollout, after a model call whose answer is still streaming)."""
        if self.windows is not None and self.windows.reads_files:
            self.windows.seen(self.secrets.redact(stdout))

    def keep(self, stdout: str, stderr: str) -> None:
        """The tails of a step whose run was taken away (cancelled, recovered)."""
        try:
            services.step_output_record(
                step_run_id=self.step_run_id,
                stdout=self.secrets.redact(stdout),
                stderr=self.secrets.redact(stderr),
                running_only=False,
            )
        except DatabaseError:
            logger.exception("could not keep the output of step %s", self.step_run_id)

    def stop_when(self, stdout: str, stderr: str) -> str | None:
        if not self.is_agent:
            return None
        self.signal = live_rate_limit(
            self.provider,
            self.secrets.redact(stdout),
            self.secrets.redact(stderr),
            now=timezone.now(),
        )
        if self.signal is not None:
            return STOP_RATE_LIMIT
        if self.errors >= int(settings.LOOPSWEB_STEP_PROVIDER_ERRORS):
            return STOP_PROVIDER_ERRORS
        return None

    def outcome(
        self, result: ProcessResult, *, timeout_ms: int | None, idle_ms: int | None
    ) -> tuple[str, str | None]:
        """`step_outcome` of this step's result, with what this watch saw of its progress."""
        progress = None
        if self.tracks_progress:
            line = self.progress_line
            if line is not None:
                progress = progress_summary(self.provider, self.secrets.redact(line))
        return step_outcome(
            result,
            provider=self.provider,
            is_agent=self.is_agent,
            timeout_ms=timeout_ms,
            idle_ms=idle_ms,
            tracks_progress=self.tracks_progress,
            last_progress=progress,
            provider_errors=(self.errors, self.secrets.redact(self.last_error or "")),
        )


def _last_line(provider: str | None, stdout: str, stderr: str) -> str:
    for text in (stdout, stderr):
        lines = summarize_output(provider, text).splitlines()
        if lines:
            return LAST_OUTPUT.format(line=lines[-1])
    return ""


def step_outcome(
    result: ProcessResult,
    *,
    provider: str | None,
    is_agent: bool,
    timeout_ms: int | None,
    idle_ms: int | None,
    tracks_progress: bool = False,
    last_progress: str | None = None,
    provider_errors: tuple[int, str] = (0, ""),
) -> tuple[str, str | None]:
    """(status, error) of a step's finished process. With `tracks_progress`, an idle
    timeout names `last_progress` (None: there was none) rather than the last output."""
    agent_message = (
        agent_error(provider, result.stdout, result.stderr, result.exit_code)
        if is_agent
        else None
    )
    seen = _last_line(provider, result.stdout, result.stderr)
    if result.timeout == "total":
        return StepStatus.TIMED_OUT, STEP_TIMED_OUT.format(ms=timeout_ms) + seen
    if result.timeout == "idle":
        if tracks_progress:
            seen = (
                LAST_PROGRESS.format(line=last_progress)
                if last_progress
                else NO_PROGRESS
            )
        return StepStatus.TIMED_OUT, STEP_IDLE_TIMED_OUT.format(
            duration=seconds(idle_ms)
        ) + seen
    if result.timeout == "deadline":
        return StepStatus.TIMED_OUT, STEP_TASK_TIMED_OUT.format(
            seconds=settings.Q_TIMEOUT, margin=int(task_margin_seconds())
        ) + seen
    if result.stopped == STOP_RATE_LIMIT:
        return StepStatus.FAILED, agent_message or STEP_RATE_LIMITED
    if result.stopped == STOP_PROVIDER_ERRORS:
        count, error = provider_errors
        return StepStatus.FAILED, STEP_PROVIDER_ERRORS.format(count=count, error=error)
    if result.signal_name:
        return StepStatus.FAILED, STEP_KILLED.format(name=result.signal_name)
    if result.exit_code != 0:
        return StepStatus.FAILED, agent_message or STEP_EXIT_CODE.format(
            code=result.exit_code
        )
    return StepStatus.SUCCEEDED, None
