"""A step's rate-limit windows while it runs and when it ends (docs/windows.md).

`WindowWatch.seen(stdout)` reads what the step's CLI has told so far (agents.window_parse):
claude's `rate_limit_event` lines and opencode's error headers on stdout; for codex, the
rollout file its thread id names under the account's `CODEX_HOME/sessions/`. When that differs
from what this watch recorded last, it is recorded for the step's account
(`ledger.windows.windows_claimed`: an exhausted window is bounded per task and lasts 15
minutes unless loopsweb's own request confirms it, ledger.claims). `runs.agent_step.StepWatch` calls it on every output flush,
for codex also every flush interval without output (the rollout changes while stdout is
quiet), and once when the process has ended. A database error is logged, never raised: windows never
fail a step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from django.db import DatabaseError
from django.utils import timezone

from agents.window_parse import codex_rollout_windows, codex_thread_id, stdout_windows
from domain.windows import Window
from ledger.claims import WINDOW, Claim, confirm_enqueue
from ledger.windows import windows_claimed

logger = logging.getLogger(__name__)

ROLLOUT_TAIL_BYTES = 1 << 20


def rollout_path(codex_home: str | None, thread_id: str | None) -> Path | None:
    """`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-…-<thread id>.jsonl`, newest first."""
    if not codex_home or not thread_id:
        return None
    sessions = Path(codex_home) / "sessions"
    try:
        found = sorted(sessions.glob(f"*/*/*/rollout-*-{thread_id}.jsonl"))
    except OSError:
        return None
    return found[-1] if found else None


def read_tail(path: Path, size: int = ROLLOUT_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            end = handle.tell()
            handle.seek(max(0, end - size))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _key(windows: list[Window]) -> tuple[tuple[object, ...], ...]:
    return tuple(
        sorted((w.name, w.used, w.status, w.resets_at, w.source) for w in windows)
    )


class WindowWatch:
    def __init__(
        self,
        *,
        account: str | None,
        provider: str | None,
        env: Mapping[str, str] | None = None,
        step_run_id: str | None = None,
    ) -> None:
        self.account = account
        self.provider = provider
        self.codex_home = (env or {}).get("CODEX_HOME")
        self.step_run_id = step_run_id
        self.thread_id: str | None = None
        self.recorded: tuple[tuple[object, ...], ...] = ()
        self.confirming: set[str] = set()  # windows whose confirmation is queued

    @property
    def reads_files(self) -> bool:
        """Whether the windows come from a file the CLI writes (so may change while its
        output does not), not from its output."""
        return self.provider == "codex"

    def windows(self, stdout: str) -> list[Window]:
        now = timezone.now()
        if self.provider == "codex":
            self.thread_id = self.thread_id or codex_thread_id(stdout)
            path = rollout_path(self.codex_home, self.thread_id)
            if path is None:
                return []
            return codex_rollout_windows(read_tail(path), observed_at=now)
        return stdout_windows(self.provider, stdout, observed_at=now)

    def seen(self, stdout: str) -> int:
        """Record what is new since the last call; how many windows were written."""
        if not self.account:
            return 0
        found = self.windows(stdout)
        key = _key(found)
        if not found or key == self.recorded:
            return 0
        try:
            # Bounded per task, 15 minutes unless confirmed (ledger.claims).
            written, claimed = windows_claimed(
                account=self.account,
                provider=self.provider,
                windows=found,
                step_run_id=self.step_run_id,
            )
        except DatabaseError:
            logger.exception("could not record the windows of account %s", self.account)
            return 0
        self.recorded = key
        for window in claimed:
            self._confirm(window)
        return written

    def _confirm(self, window: Window) -> None:
        """Queue the confirmation of an exhausted window (once per window and step)."""
        if self.account is None or window.resets_at is None:
            return
        if window.name in self.confirming:
            return
        self.confirming.add(window.name)
        claim = Claim(
            account=self.account,
            kind=WINDOW,
            until=window.resets_at,
            reason=window.source,
            tool=self.provider,
            window=window.to_dict(),
        )
        confirm_enqueue(claim, step_run_id=self.step_run_id)
