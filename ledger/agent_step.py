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
  while there is new output (`ledger.processes.run_process` calls it), and, for an agent,
  `ledger.agent_output.live_rate_limit` on the output so far: a rate limit the agent hit but
  is still retrying stops it at once.
- `step_outcome`: status and error of a finished process; an agent's error is its own
  message with the exit code after it (`ledger.agent_output.agent_error`).
- No secret in the ledger: `StepWatch.run` runs the step's process and hands on its result
  with the step's secrets (`Invocation.secrets`: its account's env file values, variables
  whose names look secret; ledger.redaction) replaced by `[redacted:NAME]`, and the live
  flushes and the live rate-limit check see the output redacted the same way. The tails,
  the error, the rate-limit snippet (cooldown reason, events) are all built from that.

No transaction here; `StepWatch.flush` is one autocommit statement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from ledger import services
from ledger.agent_output import agent_error, live_rate_limit, summarize_output
from ledger.models import StepStatus
from ledger.processes import ProcessResult, run_process
from ledger.providers import Invocation
from ledger.ratelimit import RateLimitSignal
from ledger.redaction import Redactor

logger = logging.getLogger(__name__)

STEP_TIMED_OUT = "step timed out after {ms} ms"
STEP_IDLE_TIMED_OUT = "step produced no output for {ms} ms (idle timeout)"
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


class StepWatch:
    """Callbacks for `run_process` while one step runs; `run` wires them in."""

    def __init__(
        self,
        step_run_id: str,
        provider: str | None,
        *,
        is_agent: bool,
        secrets: Redactor | None = None,
    ):
        self.step_run_id = step_run_id
        self.provider = provider
        self.is_agent = is_agent
        self.secrets = secrets or Redactor()
        self.signal: RateLimitSignal | None = None
        self.flushes = 0

    def run(
        self,
        *,
        invocation: Invocation,
        timeout_seconds: float | None,
        idle_timeout_seconds: float | None,
        tail_bytes: int,
        grace_seconds: float,
        on_spawn: Callable[[int], None],
        keep_alive: Callable[[], bool],
        keep_alive_every: float,
        deadline: float | None = None,
        output_every: float = 5.0,
    ) -> ProcessResult:
        """`run_process` with this watch's `flush` and `stop_when`; the result with the
        invocation's secrets redacted (module docstring), before anything records it."""
        self.secrets = invocation.secrets
        result = run_process(
            invocation=invocation,
            timeout_seconds=timeout_seconds,
            idle_timeout_seconds=idle_timeout_seconds,
            tail_bytes=tail_bytes,
            grace_seconds=grace_seconds,
            on_spawn=on_spawn,
            keep_alive=keep_alive,
            keep_alive_every=keep_alive_every,
            deadline=deadline,
            on_output=self.flush,
            output_every=output_every,
            stop_when=self.stop_when,
        )
        return self.redacted(result)

    def redacted(self, result: ProcessResult) -> ProcessResult:
        """`result` with the step's secrets replaced by markers (ledger.redaction)."""
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
            services.step_output_record(
                step_run_id=self.step_run_id,
                stdout=self.secrets.redact(stdout),
                stderr=self.secrets.redact(stderr),
            )
            self.flushes += 1
        except DatabaseError:  # the output is written again when the step ends
            logger.exception("could not write the output of step %s", self.step_run_id)

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
        return STOP_RATE_LIMIT if self.signal is not None else None


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
) -> tuple[str, str | None]:
    """(status, error) of a step's finished process."""
    agent_message = (
        agent_error(provider, result.stdout, result.stderr, result.exit_code)
        if is_agent
        else None
    )
    seen = _last_line(provider, result.stdout, result.stderr)
    if result.timeout == "total":
        return StepStatus.TIMED_OUT, STEP_TIMED_OUT.format(ms=timeout_ms) + seen
    if result.timeout == "idle":
        return StepStatus.TIMED_OUT, STEP_IDLE_TIMED_OUT.format(ms=idle_ms) + seen
    if result.timeout == "deadline":
        return StepStatus.TIMED_OUT, STEP_TASK_TIMED_OUT.format(
            seconds=settings.Q_TIMEOUT, margin=int(task_margin_seconds())
        ) + seen
    if result.stopped == STOP_RATE_LIMIT:
        return StepStatus.FAILED, agent_message or STEP_RATE_LIMITED
    if result.signal_name:
        return StepStatus.FAILED, STEP_KILLED.format(name=result.signal_name)
    if result.exit_code != 0:
        return StepStatus.FAILED, agent_message or STEP_EXIT_CODE.format(
            code=result.exit_code
        )
    return StepStatus.SUCCEEDED, None
