"""Plain-text summaries of ledger rows shared by the admin, the /ops pages, the API and the
commands: worktrees, commits, durations, a step's attempts, token usage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from ledger.models import (
    RunStatus,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
)


def worktree_text(run: WorkflowRun) -> str:
    """Where a run worked: its git worktree and branch, and what became of the worktree.

    `-` for a run that had none (worktree mode off, or the project is not a git work tree).
    """
    if not run.worktree_path:
        return "-"
    branch = f" on branch {run.worktree_branch}" if run.worktree_branch else ""
    if run.worktree_removed_at is not None:
        state = f"removed {run.worktree_removed_at:%Y-%m-%d %H:%M} UTC"
    elif run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
        state = "in use"
    elif run.status == RunStatus.SUCCEEDED or run.finished_at is None:
        state = "to be removed"
    else:
        until = run.finished_at + timedelta(
            seconds=settings.LOOPSWEB_WORKTREE_KEEP_SECONDS
        )
        state = f"kept until {until:%Y-%m-%d %H:%M} UTC"
    return f"{run.worktree_path}{branch} ({state})"


NO_CHANGES = "no changes: the run left the project as it was"
# The checkout an operator copies runs none of what an agent may have planted in the project's
# config (hooks, an fsmonitor command), as loopsweb's own git never does (runs.git).
CHECKOUT_COMMAND = (
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false switch {branch}"
)


def commit_text(run: WorkflowRun) -> str:
    """What a run left on its branch (runs.worktrees.worktree_commit): the branch, its
    head, the diffstat's summary line and the command that checks it out; why the work was
    not committed and where it is kept, when it was not; `-` before the run ended or when it
    had no worktree."""
    if run.worktree_path and run.commit_error:
        return run.commit_error
    if not run.worktree_path or run.commit_head is None:
        return "-"
    if not run.commit_diffstat:
        return NO_CHANGES
    lines = run.commit_diffstat.strip().splitlines()
    summary = lines[-1].strip() if lines else ""
    return (
        f"branch {run.worktree_branch} at {run.commit_head[:12]} ({summary}); "
        f"check it out in the project: {CHECKOUT_COMMAND.format(branch=run.worktree_branch)}"
    )


def duration_text(total: float) -> str:
    """A duration in whole seconds, the one way the admin, /ops/ and the commands say one:
    `42 s`, `5 min 3 s`, `2 h 10 min`, `3 d 4 h` (two units at most; a second unit of 0 is
    left out: `5 min`, `24 h`; days from 48 hours on)."""
    whole = max(0, int(total))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return _two_units(whole, (60, "min"), (1, "s"))
    if whole < 2 * 86400:
        return _two_units(whole, (3600, "h"), (60, "min"))
    return _two_units(whole, (86400, "d"), (3600, "h"))


def _two_units(whole: int, big: tuple[int, str], small: tuple[int, str]) -> str:
    count, rest = divmod(whole, big[0])
    part = rest // small[0]
    return f"{count} {big[1]} {part} {small[1]}" if part else f"{count} {big[1]}"


def since_text(value: datetime | None, now: datetime) -> str:
    """How long ago `value` was (`duration_text`; `in ...` for a time still to come), blank
    when unknown: `3 min 5 s ago`, `in 12 min`."""
    if value is None:
        return ""
    delta = (now - value).total_seconds()
    text = duration_text(abs(delta))
    return f"in {text}" if delta < 0 else f"{text} ago"


def seconds(ms: int | None) -> str:
    """A duration in milliseconds: tenths of a second under 100 s (`12.3 s`), else
    `duration_text` (`12 min 34 s`, `2 h 5 min`); blank when unknown."""
    if ms is None:
        return ""
    value = ms / 1000
    if value < 100:
        return f"{value:.1f} s"
    return duration_text(round(value))


# How an attempt ended, as the story of a step reads it.
ATTEMPT_OUTCOMES = {
    "rate_limited": "rate limited",
    "timed_out": "timed out",
    "login_failed": "login failed",
    "unresponsive": "unresponsive (no progress)",
}


def attempt_text(attempt: WorkflowStepAttempt, now: datetime | None = None) -> str:
    """One attempt: `cx-a → rate limited after 0.6 s`, `cx-b, succeeded in 1.4 s`,
    `cx-b, running for 12.0 s`."""
    account = attempt.account_profile or "no account"
    took = seconds(attempt.duration_ms)
    if attempt.status == "running":
        since = (
            seconds(int((now - attempt.started_at).total_seconds() * 1000))
            if now is not None
            else ""
        )
        return f"{account}, running" + (f" for {since}" if since else "")
    outcome = ATTEMPT_OUTCOMES.get(attempt.status, attempt.status)
    if attempt.status == "succeeded":
        return f"{account}, succeeded" + (f" in {took}" if took else "")
    return f"{account} → {outcome}" + (f" after {took}" if took else "")


def attempts_story(
    step_id: str, attempts: Sequence[WorkflowStepAttempt], now: datetime | None = None
) -> str:
    """A step's attempts in order, one line: `worker: cx-a → rate limited after 0.6 s →
    cx-b, succeeded in 1.4 s` ("" when the step never started)."""
    if not attempts:
        return ""
    return f"{step_id}: " + " → ".join(attempt_text(a, now) for a in attempts)


@dataclass(frozen=True)
class UsageSum:
    """Tokens and cost summed over steps or attempts (None: none of them reported any)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None

    def __add__(self, other: UsageSum) -> UsageSum:
        def add(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else a + b

        return UsageSum(
            add(self.input_tokens, other.input_tokens),
            add(self.output_tokens, other.output_tokens),
            add(self.cached_tokens, other.cached_tokens),
            add(self.cost_usd, other.cost_usd),
        )

    @property
    def reported(self) -> bool:
        return self.input_tokens is not None or self.output_tokens is not None

    def text(self) -> str:
        """`1,234 in / 56 out (cached 1,000), $0.0123`, or `—` when nothing was reported."""
        if not self.reported:
            return "—"
        parts = f"{self.input_tokens or 0:,} in / {self.output_tokens or 0:,} out"
        if self.cached_tokens:
            parts += f" (cached {self.cached_tokens:,})"
        if self.cost_usd is not None:
            parts += f", ${self.cost_usd:.4f}"
        return parts


def row_usage(row: WorkflowStepRun | WorkflowStepAttempt) -> UsageSum:
    return UsageSum(
        row.usage_input_tokens,
        row.usage_output_tokens,
        row.usage_cached_tokens,
        row.usage_cost_usd,
    )


def step_usage(
    step: WorkflowStepRun, attempts: Sequence[WorkflowStepAttempt]
) -> UsageSum:
    """A step's usage over all its attempts (a rate-limited try may have used tokens too);
    the step row's own for a step recorded before attempts were."""
    if not attempts:
        return row_usage(step)
    return sum((row_usage(a) for a in attempts), UsageSum())
