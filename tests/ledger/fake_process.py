"""A scripted stand-in for a step's process, so the runner's decisions are tested in this
process, fast, with no agent started (tests/ledger/test_runner_fast.py).

`install_fake_process(settings, monkeypatch, tmp_path)` patches the name the runner calls,
`runs.agent_step.run_process` (`StepWatch.run` looks it up there), with a `FakeProcess`.
Each call "runs" one attempt of one step on one account, read from its `Invocation` as
the real agent would read it (`LOOPSWEB_RUN_ID`, `LOOPSWEB_STEP_ID`,
`LOOPSWEB_ACCOUNT_PROFILE`, the provider), and plays the `Outcome` scripted for it the
way `runs.processes.run_process` tells its watch:

1. `watch.spawned(pid)`: the runner records the pid on the step. The pid is at or above
   PID_MAX_LIMIT (2^22, include/linux/threads.h: the kernel refuses a `pid_max` above
   it), so no process has it: `os.getpgid` raises ProcessLookupError (checked at each
   call), and a kill path that reaches the step's pid (the reaper, a cancel) signals
   nothing of ours.
2. The scripted output, split into lines for `watch.line` when `watch.tracks_progress`
   (a codex step's JSON events are its progress), kept as bounded tails as the real
   supervisor keeps them (`runs.processes.OutputTail`, `Limits.tail_bytes`).
3. As the supervisor does for a process that ran `duration_ms`: `watch.flush` once
   there is output and the attempt lasted `Limits.output_every`; `watch.stop_when` on
   the output (a live rate limit stops the step, killed: `ProcessResult.stopped`);
   `watch.keep_alive` once the attempt lasted `Limits.keep_alive_every` (False: the
   lease is lost, the step killed, `ProcessResult.lost`).
4. A `ProcessResult` with the scripted exit code, output and timeout. A timeout lasts
   the step's own limit (an `idle` one needs the step to have an idle limit, else the
   fake fails the test: a step without one cannot hang out).

What each outcome prints is what the runner's parsers read (agents.ratelimit,
agents.agent_output, agents.usage): `succeeds` (codex JSON events with usage for a
codex step, plain text for the others), `rate_limited` (a 429 with Retry-After),
`login_refused` (401 Unauthorized), `hangs` (the idle limit), `try_later` (exit 75),
`fails`. `FakeProcess.script(outcome, account=, step=, times=)` says which attempts play
it (the most specific rule with uses left wins: step and account, step, account, any);
unscripted attempts succeed. `FakeProcess.calls` are the attempts as they ran,
`FakeProcess.results` what each returned.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agents.providers import PROVIDERS
from runs import agent_step
from runs.processes import (
    Limits,
    LineSplitter,
    OutputTail,
    ProcessResult,
    ProcessWatch,
)
from runs.providers import Invocation

# PID_MAX_LIMIT on 64-bit Linux: /proc/sys/kernel/pid_max cannot be set higher, and pids
# stay below pid_max, so no process (in any pid namespace) ever has this pid or a later one.
FAKE_PID_BASE = 4_194_304
# How long an attempt "runs" unless scripted: past the default flush interval
# (LOOPSWEB_OUTPUT_FLUSH_SECONDS, 5 s), so its output is flushed once while it runs, and
# short of a lease renewal (a third of LOOPSWEB_RUN_LEASE_SECONDS, 30 s in these tests).
DEFAULT_DURATION_MS = 6_000
# The CLI every provider is configured with: a name `shutil.which` finds, never run.
NEVER_RUN = (
    "#!/bin/sh\n"
    "echo 'tests/ledger/fake_process.py: this CLI is only a name, it must never run' >&2\n"
    "exit 97\n"
)

# What the real codex prints (docs/agents.md; tests/agents/test_agent_output.py).
CODEX_USAGE = {"input_tokens": 1200, "cached_input_tokens": 200, "output_tokens": 34}
RATE_LIMIT_TEXT = "HTTP 429 Too Many Requests. Retry-After: {seconds}"
LOGIN_REFUSED_TEXT = "unexpected status 401 Unauthorized"


def unused_pid(n: int) -> int:
    """The `n`th fake pid, checked to be no process at all (module docstring, 1)."""
    pid = FAKE_PID_BASE + n
    try:
        os.getpgid(pid)
    except ProcessLookupError:
        return pid
    raise AssertionError(f"pid {pid} names a process: the fake's pids must not")


@dataclass(frozen=True)
class Call:
    """One attempt the fake played: which run, step and account, and what it played."""

    run_id: str | None
    step: str | None
    account: str | None
    provider: str | None
    argv: list[str]
    cwd: str | None
    pid: int
    outcome: str
    limits: Limits = field(repr=False)


@dataclass(frozen=True)
class Outcome:
    """How one attempt ends. `timeout`: "total", "idle" or "deadline" (the step's limit
    was reached: its process was killed, `signal_name`); `during(call)`: called once the
    process "started" (after `watch.spawned`), to change the world meanwhile (cancel the
    run, take a slot); `spawn_error`: the process could not start at all."""

    name: str
    exit_code: int | None = 0
    stdout: str = ""
    stderr: str = ""
    timeout: str | None = None
    signal_name: str | None = None
    duration_ms: int = DEFAULT_DURATION_MS
    during: Callable[[Call], None] | None = None
    spawn_error: str | None = None


def succeeds(provider: str | None = None, *, message: str = "Done.") -> Outcome:
    """Exit 0. A codex step prints codex's JSON events (a command, its answer, a turn
    with usage: `CODEX_USAGE`); another provider, plain lines."""
    if provider == "codex":
        events: list[dict[str, Any]] = [
            {"type": "thread.started", "thread_id": "0199-fake"},
            {"type": "turn.started"},
            {
                "type": "item.completed",
                "item": {
                    "id": "item_0",
                    "type": "command_execution",
                    "command": "/bin/bash -lc 'make test'",
                    "aggregated_output": "ok\n",
                    "exit_code": 0,
                    "status": "completed",
                },
            },
            {
                "type": "item.completed",
                "item": {"id": "item_1", "type": "agent_message", "text": message},
            },
            {"type": "turn.completed", "usage": CODEX_USAGE},
        ]
        stdout = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
        return Outcome("succeeds", stdout=stdout)
    return Outcome("succeeds", stdout=f"fake-process: working\n{message}\n")


def rate_limited(seconds: int | None = 120, *, exit_code: int = 1) -> Outcome:
    """A provider 429 on stderr, naming its reset `seconds` off (None: no reset named,
    "usage limit reached": the cooldown backoff applies)."""
    text = (
        "usage limit reached"
        if seconds is None
        else RATE_LIMIT_TEXT.format(seconds=seconds)
    )
    return Outcome(
        "rate_limited",
        exit_code=exit_code,
        stdout="fake-process: working\n",
        stderr=f"{text}\n",
    )


def login_refused(text: str = LOGIN_REFUSED_TEXT) -> Outcome:
    """A refused login (agents.ratelimit.detect_login_failure), exit 1."""
    return Outcome(
        "login_refused", exit_code=1, stdout="fake-process: working\n", stderr=text
    )


def hangs() -> Outcome:
    """A start line, then no progress until the idle limit killed it (SIGTERM)."""
    return Outcome(
        "hangs",
        exit_code=None,
        signal_name="SIGTERM",
        timeout="idle",
        stdout="fake-process: started\n",
    )


def try_later() -> Outcome:
    """Exit 75 (EX_TEMPFAIL): the agent asks to be run again later."""
    return Outcome(
        "try_later", exit_code=75, stderr="fake-process: not now, try later\n"
    )


def fails(exit_code: int = 1, stderr: str = "fake-process: it broke") -> Outcome:
    """An ordinary failure: `stderr`'s last line is the agent's message."""
    return Outcome("fails", exit_code=exit_code, stderr=stderr)


def cannot_start(error: str = "[Errno 2] No such file or directory") -> Outcome:
    """The process could not be started (`Popen` raised): no pid, no output."""
    return Outcome("cannot_start", exit_code=None, spawn_error=error)


@dataclass
class _Rule:
    outcome: Outcome
    account: str | None
    step: str | None
    times: int | None  # uses left; None: every matching attempt

    def matches(self, step: str | None, account: str | None) -> bool:
        return (self.step is None or self.step == step) and (
            self.account is None or self.account == account
        )

    @property
    def rank(self) -> int:
        return (2 if self.step is not None else 0) + (
            1 if self.account is not None else 0
        )


class FakeProcess:
    """`runs.agent_step.run_process` as a script (module docstring)."""

    def __init__(self) -> None:
        self.rules: list[_Rule] = []
        self.calls: list[Call] = []
        self.results: list[ProcessResult] = []  # what each call returned, in order

    def script(
        self,
        outcome: Outcome,
        *,
        account: str | None = None,
        step: str | None = None,
        times: int | None = None,
    ) -> None:
        """Attempts of `step` (any step: None) on `account` (any account: None) play
        `outcome`, the next `times` of them (None: all)."""
        self.rules.append(_Rule(outcome, account, step, times))

    def accounts(self, step: str | None = None) -> list[str | None]:
        """The accounts the attempts (of `step`) ran on, in order."""
        return [c.account for c in self.calls if step is None or c.step == step]

    def _outcome(
        self, step: str | None, account: str | None, provider: str | None
    ) -> Outcome:
        usable = [
            rule
            for rule in self.rules
            if rule.matches(step, account) and (rule.times is None or rule.times > 0)
        ]
        if not usable:
            return succeeds(provider)
        rule = max(usable, key=lambda r: r.rank)  # the first of the most specific
        if rule.times is not None:
            rule.times -= 1
        return rule.outcome

    def __call__(
        self,
        *,
        invocation: Invocation,
        limits: Limits,
        watch: ProcessWatch | None = None,
    ) -> ProcessResult:
        watch = watch or ProcessWatch()
        env = invocation.env
        step = env.get("LOOPSWEB_STEP_ID")
        account = env.get("LOOPSWEB_ACCOUNT_PROFILE")
        outcome = self._outcome(step, account, invocation.provider)
        call = Call(
            run_id=env.get("LOOPSWEB_RUN_ID"),
            step=step,
            account=account,
            provider=invocation.provider,
            argv=list(invocation.argv),
            cwd=invocation.cwd,
            pid=unused_pid(len(self.calls) + 1),
            outcome=outcome.name,
            limits=limits,
        )
        self.calls.append(call)
        result = self._run(outcome, call, limits, watch)
        self.results.append(result)
        return result

    def _run(
        self, outcome: Outcome, call: Call, limits: Limits, watch: ProcessWatch
    ) -> ProcessResult:
        if outcome.spawn_error is not None:
            return ProcessResult(
                pid=None,
                exit_code=None,
                signal_name=None,
                stdout="",
                stderr="",
                duration_ms=0,
                spawn_error=f"step could not be started: {outcome.spawn_error}",
            )
        watch.spawned(call.pid)
        if outcome.during is not None:
            outcome.during(call)
        return _played(outcome, call, limits, watch)


def _played(
    outcome: Outcome, call: Call, limits: Limits, watch: ProcessWatch
) -> ProcessResult:
    """The attempt's output told to `watch`, and its result (module docstring, 2-4)."""
    out, err = OutputTail(limits.tail_bytes), OutputTail(limits.tail_bytes)
    for tail, name, text in (
        (out, "stdout", outcome.stdout),
        (err, "stderr", outcome.stderr),
    ):
        data = text.encode()
        if watch.tracks_progress:
            LineSplitter(name, watch.line).feed(data)
        tail.add(data)
    duration_ms = _duration_ms(outcome, limits)
    stopped = None
    if outcome.stdout or outcome.stderr:
        if duration_ms >= limits.output_every * 1000:
            watch.flush(out.text(), err.text())
        stopped = watch.stop_when(out.text(), err.text())
    lost = False
    if stopped is None and duration_ms >= limits.keep_alive_every * 1000:
        lost = not watch.keep_alive()
    exit_code, signal_name, timeout = (
        outcome.exit_code,
        outcome.signal_name,
        outcome.timeout,
    )
    if stopped is not None or lost:
        # Killed before it ended by itself (SIGTERM first; the CLI obeys it).
        exit_code, signal_name, timeout = None, "SIGTERM", None
    return ProcessResult(
        pid=call.pid,
        exit_code=exit_code,
        signal_name=signal_name,
        stdout=out.text(),
        stderr=err.text(),
        duration_ms=duration_ms,
        timeout=timeout,
        lost=lost,
        stopped=stopped,
    )


def _duration_ms(outcome: Outcome, limits: Limits) -> int:
    """A timed-out attempt lasts its limit; any other, what the outcome says."""
    limit = {
        "total": limits.timeout_seconds,
        "idle": limits.idle_timeout_seconds,
    }.get(outcome.timeout or "")
    if outcome.timeout in ("total", "idle"):
        if not limit:
            raise AssertionError(
                f"outcome {outcome.name} times out ({outcome.timeout}) but the step has "
                "no such limit"
            )
        return int(limit * 1000)
    if outcome.timeout == "deadline" and limits.deadline is None:
        raise AssertionError(f"outcome {outcome.name}: the step has no task deadline")
    return outcome.duration_ms


def install_fake_process(
    settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> FakeProcess:
    """A `FakeProcess` as the process of every step the runner starts (patched where
    `StepWatch.run` looks it up), with every provider's CLI a name only, never run; the
    runner's settings as the fake agent's tests have them (runner_helpers)."""
    cli = tmp_path / "never-run-cli"
    cli.write_text(NEVER_RUN)
    cli.chmod(0o755)
    settings.LOOPSWEB_PROVIDER_BINARIES = {p: str(cli) for p in PROVIDERS}
    settings.LOOPSWEB_KILL_GRACE_SECONDS = 0.3
    settings.LOOPSWEB_STEP_START_POLL_SECONDS = 0.05
    settings.LOOPSWEB_RUN_LEASE_SECONDS = 30
    settings.LOOPSWEB_COOLDOWN_BASE_SECONDS = 60
    settings.LOOPSWEB_COOLDOWN_CAP_SECONDS = 3600
    fake = FakeProcess()
    monkeypatch.setattr(agent_step, "run_process", fake)
    return fake
