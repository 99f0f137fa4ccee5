"""What runs under the admission lock (issue 44): a pytest plugin that records every file-system,
subprocess and network call a test process makes while its transaction holds the lock.

    scripts/test.sh <tests> -p tests.bench.lock_audit     # PostgreSQL: the lock is a SQL call

The lock is held from the statement that takes `pg_advisory_xact_lock` until its outermost
transaction ends. Calls are caught by an audit hook (open, subprocess, socket, listdir, ...)
and by wrapping `os.stat` / `os.lstat` (isdir, exists, realpath: no audit event of their own),
and counted by the loopsweb function that made them. The table is written at the end of the
session to tests/bench/results/lock-audit.txt (a measurement, never an assertion).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.bench.harness import RESULTS_DIR

OUR_CODE = ("/ledger/", "/routing/", "/domain/", "/loopsweb/")
EVENTS = ("open", "subprocess.Popen", "os.exec", "socket.connect", "os.listdir",
          "os.scandir", "os.mkdir", "os.rename", "os.remove", "os.chmod", "shutil.")  # fmt: skip
_seen: Counter[tuple[str, str]] = Counter()
_held_for: list[float] = []
_inside = threading.local()
# Atomic blocks open when the test body starts (pytest-django's own transaction around a test
# that is not transactional): the lock is held until the first block above them ends.
_baseline = 0


def _held() -> bool:
    from django.db import connection

    marker = getattr(connection, "_audit_locked_block", None)
    blocks = getattr(connection, "atomic_blocks", None) or []
    return (
        marker is not None and len(blocks) > _baseline and blocks[_baseline] is marker
    )


def _caller() -> str:
    """The innermost loopsweb frame (tests excluded), else the innermost library frame."""
    frames = list(reversed(traceback.extract_stack()[:-3]))
    ours = [
        f"{'/'.join(frame.filename.rsplit('/', 2)[-2:])}:{frame.lineno} {frame.name}"
        for frame in frames
        if "/tests/" not in frame.filename
        and any(p in frame.filename for p in OUR_CODE)
    ]
    if ours:
        return " < ".join(ours[:5])
    for frame in frames:
        if "site-packages" in frame.filename:
            name = frame.filename.split("site-packages/", 1)[1]
            return f"(library) {name}:{frame.lineno} {frame.name}"
    return "(test code)"


def _note(event: str) -> None:
    if getattr(_inside, "busy", False):
        return
    _inside.busy = True
    try:
        if _held():
            _seen[(event, _caller())] += 1
    finally:
        _inside.busy = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event.startswith(EVENTS):
        _note(event)


def _wrap(name: str) -> None:
    original: Callable[..., Any] = getattr(os, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _note(f"os.{name}")
        return original(*args, **kwargs)

    setattr(os, name, wrapped)


def pytest_configure(config: Any) -> None:
    from django.db.backends import utils

    execute = utils.CursorWrapper.execute

    def marking(self: Any, sql: str, params: Any = None) -> Any:
        result = execute(self, sql, params)
        blocks = self.db.atomic_blocks
        if "pg_advisory_xact_lock" in sql and len(blocks) > _baseline:
            if getattr(self.db, "_audit_locked_block", None) is not blocks[_baseline]:
                self.db._audit_locked_block = blocks[_baseline]
                self.db._audit_locked_at = time.monotonic()
                self.db.on_commit(lambda db=self.db: _held_for.append(
                    time.monotonic() - db._audit_locked_at))  # fmt: skip
        return result

    # For the whole session (a plugin run by hand, never part of make test).
    pytest.MonkeyPatch().setattr(utils.CursorWrapper, "execute", marking)
    sys.addaudithook(_audit)
    _wrap("stat")
    _wrap("lstat")


def pytest_runtest_call(item: Any) -> None:
    global _baseline
    from django.db import connection

    _baseline = len(connection.atomic_blocks)


def pytest_unconfigure(config: Any) -> None:
    RESULTS_DIR.mkdir(exist_ok=True)
    lines = [
        "calls made while the admission lock was held (event, loopsweb caller, count)"
    ]
    for (event, caller), n in sorted(_seen.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"{n:7d}  {event:18s} {caller}")
    if _held_for:
        held = sorted(_held_for)
        lines.append(
            f"committed lock holds: {len(held)}, median {held[len(held) // 2] * 1000:.1f} ms,"
            f" p95 {held[int(len(held) * 0.95)] * 1000:.1f} ms, max {held[-1] * 1000:.1f} ms"
        )
    Path(RESULTS_DIR / "lock-audit.txt").write_text("\n".join(lines) + "\n")
