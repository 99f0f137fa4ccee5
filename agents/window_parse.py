"""Rate-limit windows from what the agent CLIs write: pure, no ORM (docs/windows.md).

Contract:
1. codex: its rollout file (`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-…-<thread id>.jsonl`, the
   thread id from `thread.started` on stdout) has an `event_msg` of type `token_count` after
   every model answer; its `rate_limits.primary` / `secondary` carry `used_percent` (0..100),
   `window_minutes` and `resets_at` (epoch seconds). The LAST such line with a snapshot wins;
   null windows are skipped.
2. claude: `stream-json` prints `{"type":"rate_limit_event","rate_limit_info":{...}}` when the
   window state changes: `status`, `resetsAt` (epoch s), `rateLimitType` (five_hour,
   seven_day, or another name) and, at warning levels only, `utilization` (0..1). The last
   event per window wins.
3. opencode: nothing until a 429, then a final `{"type":"error"}` line whose
   `error.data.responseHeaders` are the raw response headers; they are read as "headers"
   below says, and a 429 with no window saying `rejected` marks the window the headers name
   as rejected.
4. Headers: codex's `x-codex-{primary,secondary}-{used-percent,window-minutes,reset-at}` and
   Anthropic's `anthropic-ratelimit-unified-{5h,7d,…}-{utilization,reset}` with
   `-unified-status` / `-unified-reset` / `-unified-representative-claim`.
5. Window names: 300 minutes (five_hour) is `5h`, 10080 minutes (seven_day) is `7d`; other
   minute counts read `Nd`, `Nh` or `Nm`; other provider names are kept as given.
6. Nothing here raises on bad input: what cannot be read is skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from agents.usage import json_objects
from domain.windows import STATUSES, Window, clamp_fraction

SOURCE_CODEX = "codex rollout"
SOURCE_CLAUDE = "claude rate_limit_event"
SOURCE_OPENCODE = "opencode error headers"
SOURCE_HEADERS = "response headers"

_NAMES = {"five_hour": "5h", "seven_day": "7d"}
_MAX_EPOCH = 253402300799  # 9999-12-31
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


def window_name(minutes: Any = None, name: Any = None) -> str | None:
    """A window's name (module docstring, "window names")."""
    if isinstance(minutes, int | float) and not isinstance(minutes, bool):
        m = int(minutes)
        if m > 0:
            if m % 1440 == 0:
                return f"{m // 1440}d"
            if m % 60 == 0:
                return f"{m // 60}h"
            return f"{m}m"
    if isinstance(name, str) and name.strip():
        kept = _NAME_CHARS.sub("_", name.strip())[:60]
        return _NAMES.get(kept, kept)
    return None


def epoch(value: Any) -> datetime | None:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 < value < _MAX_EPOCH:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


def _number(value: Any) -> float | None:
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _percent(value: Any) -> float | None:
    number = _number(value)
    return clamp_fraction(number / 100.0) if number is not None else None


def _status(value: Any) -> str | None:
    return value if isinstance(value, str) and value in STATUSES else None


def codex_snapshot(
    rate_limits: Any, *, source: str, observed_at: datetime | None = None
) -> list[Window]:
    """The windows of one codex `rate_limits` object (module docstring, "codex")."""
    if not isinstance(rate_limits, dict):
        return []
    out: list[Window] = []
    for key in ("primary", "secondary"):
        entry = rate_limits.get(key)
        if not isinstance(entry, dict):
            continue
        name = window_name(entry.get("window_minutes"), key)
        used = _percent(entry.get("used_percent"))
        if name is None or used is None:
            continue
        out.append(
            Window(
                name=name,
                used=used,
                resets_at=epoch(entry.get("resets_at")),
                source=source,
                observed_at=observed_at,
            )
        )
    return out


def codex_thread_id(stdout: str) -> str | None:
    """The thread id of `codex exec --json` (its `thread.started` event)."""
    for line in stdout.splitlines():
        if '"thread.started"' not in line:
            continue
        event = _json(line)
        if event and event.get("type") == "thread.started":
            thread = event.get("thread_id")
            if isinstance(thread, str) and thread and "/" not in thread:
                return thread
    return None


def _json(line: str) -> dict[str, Any] | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def codex_rollout_windows(
    text: str, *, observed_at: datetime | None = None
) -> list[Window]:
    """The windows of the last `token_count` line that has a snapshot (module docstring,
    "codex")."""
    for line in reversed(text.splitlines()):
        if '"token_count"' not in line:
            continue
        event = _json(line)
        payload = event.get("payload") if event else None
        if not isinstance(payload, dict) or payload.get("type") != "token_count":
            continue
        found = codex_snapshot(
            payload.get("rate_limits"), source=SOURCE_CODEX, observed_at=observed_at
        )
        if found:
            return found
    return []


def claude_stream_windows(
    stdout: str, *, observed_at: datetime | None = None
) -> list[Window]:
    """claude's windows in its `stream-json` output (module docstring, "claude")."""
    latest: dict[str, Window] = {}
    for line in stdout.splitlines():
        if '"rate_limit_event"' not in line:
            continue
        event = _json(line) or {}
        info = event.get("rate_limit_info")
        if not isinstance(info, dict) or event.get("type") != "rate_limit_event":
            continue
        name = window_name(None, info.get("rateLimitType")) or "session"
        latest[name] = Window(
            name=name,
            used=clamp_fraction(info.get("utilization")),
            status=_status(info.get("status")),
            resets_at=epoch(info.get("resetsAt")),
            source=SOURCE_CLAUDE,
            observed_at=observed_at,
        )
    return list(latest.values())


_ANTHROPIC = "anthropic-ratelimit-unified-"


def header_windows(
    headers: Mapping[str, Any],
    *,
    source: str = SOURCE_HEADERS,
    observed_at: datetime | None = None,
) -> list[Window]:
    """The windows response headers carry (module docstring, "headers")."""
    lower = {str(k).lower(): v for k, v in headers.items()}
    snapshot = {
        key: {
            "used_percent": _number(lower.get(f"x-codex-{key}-used-percent")),
            "window_minutes": _number(lower.get(f"x-codex-{key}-window-minutes")),
            "resets_at": _number(lower.get(f"x-codex-{key}-reset-at")),
        }
        for key in ("primary", "secondary")
    }
    out = codex_snapshot(snapshot, source=source, observed_at=observed_at)
    status = _status(lower.get(f"{_ANTHROPIC}status"))
    claim = window_name(None, lower.get(f"{_ANTHROPIC}representative-claim"))
    names = sorted(
        {
            key[len(_ANTHROPIC) : -len("-utilization")]
            for key in lower
            if key.startswith(_ANTHROPIC) and key.endswith("-utilization")
        }
    )
    for raw in names:
        name = window_name(None, raw) or raw
        out.append(
            Window(
                name=name,
                used=clamp_fraction(
                    _number(lower.get(f"{_ANTHROPIC}{raw}-utilization"))
                ),
                status=status if claim in (None, name) else None,
                resets_at=epoch(lower.get(f"{_ANTHROPIC}{raw}-reset")),
                source=source,
                observed_at=observed_at,
            )
        )
    if status and claim and not any(w.name == claim for w in out):
        out.append(
            Window(
                name=claim,
                status=status,
                resets_at=epoch(lower.get(f"{_ANTHROPIC}reset")),
                source=source,
                observed_at=observed_at,
            )
        )
    return out


def opencode_error_windows(
    stdout: str, *, observed_at: datetime | None = None
) -> list[Window]:
    """The windows in the headers of the last error line (module docstring, "opencode")."""
    for event in reversed(json_objects(stdout)):
        error = event.get("error") if event.get("type") == "error" else None
        data = error.get("data") if isinstance(error, dict) else None
        if not isinstance(data, dict):
            continue
        headers = data.get("responseHeaders")
        if not isinstance(headers, dict):
            continue
        found = header_windows(headers, source=SOURCE_OPENCODE, observed_at=observed_at)
        if data.get("statusCode") == 429:
            found = [
                w
                if w.status or (w.used is not None and w.used < 1.0)
                else Window(
                    name=w.name,
                    used=w.used,
                    status="rejected",
                    resets_at=w.resets_at,
                    source=w.source,
                    observed_at=w.observed_at,
                )
                for w in found
            ]
        return found
    return []


def stdout_windows(
    provider: str | None, stdout: str, *, observed_at: datetime | None = None
) -> list[Window]:
    """The windows an agent's own stdout tells (claude's events, opencode's error)."""
    if provider == "claude":
        return claude_stream_windows(stdout, observed_at=observed_at)
    if provider == "opencode":
        return opencode_error_windows(stdout, observed_at=observed_at)
    return []
