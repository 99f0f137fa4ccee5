"""What the real agent CLIs print, read for the ledger: pure functions, no Django, no ORM.

The formats are the ones codex, claude and opencode print headless (docs/agents.md):
- codex `exec --json`: JSON Lines events (`thread.started`, `item.started` /
  `item.completed` with an `item` of type `command_execution`, `agent_message`,
  `file_change`, ..., `turn.completed` with usage, `error`, `turn.failed`);
- claude `--print --output-format stream-json --verbose`: JSON Lines (`system` init,
  `assistant` and `user` messages, and last one `result` object with `is_error`, `result`,
  `api_error_status`, `usage` and `total_cost_usd`); `--output-format json` prints only
  that `result` object;
- opencode `run --format json`: JSON Lines (`step_start`, `tool_use`, `text`,
  `step_finish` with tokens and cost, `error`); with `--print-logs` its log goes to stderr
  as `timestamp=... level=ERROR ... message="stream error" ... error.error="..."` lines.

Contract:
1. ANSI colour codes are stripped before anything is matched or shown.
2. `agent_error(provider, stdout, stderr, exit_code)` is the agent's own account of a
   failure, with the exit code after it: claude's `result` when `is_error`, codex's
   `turn.failed` error (else its last `error` event), opencode's last `error` event's
   message; when the output has none of those and the step failed, the last line of stderr
   that is not known start-up noise. None when there is nothing to say.
3. `summarize_line(provider, line)` is one readable line for live output (a command, a tool
   call, a message, an error, usage), or None for an event that says nothing to a reader;
   a line that is not JSON is shown as it is. `summarize_output` applies it to a tail.
4. Rate limits have ONE detector, `agents.ratelimit.detect_rate_limit`. `rate_limit` runs it
   on a finished step's output; `live_rate_limit` runs it while the agent still runs, on
   the lines that report a failed model call (opencode's `level=ERROR` log lines on stderr,
   codex's `error` events, claude's `api_retry` events with `error_status` 429), so a rate limit is seen seconds after the provider answered 429,
   however long the CLI goes on retrying.
5. Progress (`line_progress`): the events of each CLI's JSON stream that show the agent is
   getting on, a model answer or a tool call (codex `item.*` and `turn.*`; claude
   `assistant`, `user` and `result`; opencode `step_*`, `tool_use` and `text`). Start-up
   events, retries and error log lines are not progress. A provider this module does not
   know has no such events: any output counts for it (`knows_progress`).
6. Provider errors (`provider_error`): a failed model call the CLI reports while it goes on
   retrying (opencode's `message="stream error"` log line, codex's `error` event such as
   `Reconnecting... 2/5`, claude's `system`/`api_retry` event), as one line naming the
   provider's error; the runner ends a step that reports several in a row with no progress
   between them.
7. `reason_line(text)` is one human line for a cooldown's or a step's reason, which carry
   the raw text the detector matched (a JSON event, possibly cut; a log line): the
   provider's message out of it (`message`, `result`, `error.message`, an `error.error=`
   log field, else the error code and HTTP status), after the part loopsweb wrote.
   A log line (`timestamp=... level=ERROR ... message="..." error.error="..."`) reads as
   `error: <message>: <cause>` in live output too.
8. Nothing here raises on bad output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from datetime import datetime
from typing import Any

from agents.ratelimit import RateLimitSignal, detect_rate_limit, strip_ansi
from agents.usage import json_objects

__all__ = [
    "agent_error",
    "knows_progress",
    "line_progress",
    "live_rate_limit",
    "progress_summary",
    "provider_error",
    "rate_limit",
    "reason_line",
    "strip_ansi",
    "summarize_line",
    "summarize_output",
]

ERROR_CHARS = 500
SUMMARY_CHARS = 300

# stderr lines the CLIs print on every start, which explain no failure.
_NOISE = (
    "Reading additional input from stdin",
    "WARNING: proceeding, even though we could not create PATH aliases",
)


def _short(text: Any, limit: int) -> str:
    value = " ".join(strip_ansi(str(text)).split())
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _events(stdout: str) -> list[dict[str, Any]]:
    return json_objects(strip_ansi(stdout or ""))


def _claude_error(events: list[dict[str, Any]]) -> str | None:
    for event in reversed(events):
        if event.get("type") == "result":
            if event.get("is_error"):
                return str(event.get("result") or event.get("subtype") or "error")
            return None
    return None


def _codex_error(events: list[dict[str, Any]]) -> str | None:
    last_error = None
    for event in events:
        kind = event.get("type")
        if kind == "turn.failed":
            error = event.get("error")
            if isinstance(error, dict) and error.get("message"):
                return str(error["message"])
        elif kind == "error" and event.get("message"):
            last_error = str(event["message"])
    return last_error


def _opencode_error(events: list[dict[str, Any]]) -> str | None:
    for event in reversed(events):
        if event.get("type") != "error":
            continue
        error = event.get("error")
        if isinstance(error, dict):
            data = found if isinstance(found := error.get("data"), dict) else {}
            message = data.get("message") or error.get("message") or error.get("name")
            if message:
                return str(message)
        elif error:
            return str(error)
        return "error"
    return None


_ERRORS = {"claude": _claude_error, "codex": _codex_error, "opencode": _opencode_error}


def _last_stderr_line(stderr: str) -> str | None:
    for line in reversed(strip_ansi(stderr or "").splitlines()):
        line = line.strip()
        if line and not line.startswith(_NOISE):
            return line
    return None


def agent_error(
    provider: str | None, stdout: str, stderr: str, exit_code: int | None
) -> str | None:
    """The agent's own error message with the exit code after it (module docstring,
    `agent_error`), or None."""
    try:
        reader = _ERRORS.get(provider or "")
        message = reader(_events(stdout)) if reader else None
        if message is None and exit_code not in (0, None):
            message = _last_stderr_line(stderr)
    except Exception:  # reading output never fails a step
        return None
    if not message:
        return None
    text = _short(message, ERROR_CHARS)
    return f"{text} (exit code {exit_code})" if exit_code is not None else text


# -- live output -----------------------------------------------------------------------


def _codex_summary(event: dict[str, Any]) -> str | None:
    kind = event.get("type")
    item = found if isinstance(found := event.get("item"), dict) else {}
    item_type = item.get("type")
    if kind == "item.started" and item_type == "command_execution":
        return f"$ {item.get('command', '')}"
    if kind == "item.completed":
        if item_type == "command_execution":
            return f"$ {item.get('command', '')} (exit {item.get('exit_code')})"
        if item_type == "agent_message":
            return f"message: {item.get('text', '')}"
        if item_type == "reasoning":
            return f"thinking: {item.get('text', '')}"
        if item_type == "file_change":
            changes = found if isinstance(found := item.get("changes"), list) else []
            paths = ", ".join(
                f"{c.get('kind', 'edit')} {c.get('path', '')}"
                for c in changes
                if isinstance(c, dict)
            )
            return f"files: {paths}"
        if item_type == "mcp_tool_call":
            return f"tool: {item.get('server', '')}.{item.get('tool', '')}"
        if item_type == "web_search":
            return f"search: {item.get('query', '')}"
        if item_type == "error":
            return f"warning: {item.get('message', '')}"
        return None
    if kind == "error":
        return f"error: {event.get('message', '')}"
    if kind == "turn.failed":
        error = found if isinstance(found := event.get("error"), dict) else {}
        return f"failed: {error.get('message', '')}"
    if kind == "turn.completed":
        usage = found if isinstance(found := event.get("usage"), dict) else {}
        return (
            f"turn done: {usage.get('input_tokens', 0)} tokens in, "
            f"{usage.get('output_tokens', 0)} out"
        )
    return None


def _tool_detail(name: str, args: Any) -> str:
    if not isinstance(args, dict):
        return name
    for key in ("command", "cmd", "file_path", "filePath", "path", "pattern", "url"):
        if args.get(key):
            return f"{name} {args[key]}"
    return name


def _claude_summary(event: dict[str, Any]) -> str | None:
    kind = event.get("type")
    if kind == "system" and event.get("subtype") == "init":
        return f"session started (model {event.get('model', '?')}, cwd {event.get('cwd', '?')})"
    if kind == "result":
        if event.get("is_error"):
            return f"error: {event.get('result', '')}"
        cost = event.get("total_cost_usd")
        return f"done: {event.get('result', '')} (cost ${cost})"
    message = found if isinstance(found := event.get("message"), dict) else {}
    content = message.get("content")
    if not isinstance(content, list):
        return None
    parts = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and block.get("text"):
            parts.append(f"message: {block['text']}")
        elif block.get("type") == "tool_use":
            parts.append(
                f"tool: {_tool_detail(str(block.get('name', '')), block.get('input'))}"
            )
        elif block.get("type") == "tool_result":
            body = block.get("content")
            text = body if isinstance(body, str) else json.dumps(body)
            label = "tool error" if block.get("is_error") else "tool result"
            parts.append(f"{label}: {text}")
    return " | ".join(parts) or None


def _opencode_summary(event: dict[str, Any]) -> str | None:
    kind = event.get("type")
    part = found if isinstance(found := event.get("part"), dict) else {}
    if kind == "tool_use":
        state = found if isinstance(found := part.get("state"), dict) else {}
        detail = _tool_detail(str(part.get("tool", "")), state.get("input"))
        return f"tool: {detail} ({state.get('status', '?')})"
    if kind == "text":
        return f"message: {part.get('text', '')}"
    if kind == "reasoning":
        return f"thinking: {part.get('text', '')}"
    if kind == "step_finish":
        tokens = found if isinstance(found := part.get("tokens"), dict) else {}
        return (
            f"step done ({part.get('reason', '?')}): {tokens.get('input', 0)} tokens in, "
            f"{tokens.get('output', 0)} out"
        )
    if kind == "error":
        return f"error: {_opencode_error([event])}"
    return None


_SUMMARIES = {
    "claude": _claude_summary,
    "codex": _codex_summary,
    "opencode": _opencode_summary,
}


def summarize_line(provider: str | None, line: str) -> str | None:
    """One readable line for an output line (module docstring, `summarize_line`)."""
    text = strip_ansi(line).strip()
    if not text:
        return None
    logged = _log_line(text)
    if logged is not None:
        return _short(logged, SUMMARY_CHARS)
    reader = _SUMMARIES.get(provider or "")
    if reader is None or not text.startswith("{"):
        return _short(text, SUMMARY_CHARS)
    try:
        event = json.loads(text)
    except (ValueError, RecursionError):
        return _short(text, SUMMARY_CHARS)
    if not isinstance(event, dict):
        return _short(text, SUMMARY_CHARS)
    try:
        summary = reader(event)
    except Exception:
        return None
    return _short(summary, SUMMARY_CHARS) if summary else None


def summarize_output(provider: str | None, text: str) -> str:
    """`summarize_line` over every line of `text`, the lines that say something."""
    lines = (summarize_line(provider, line) for line in (text or "").splitlines())
    return "\n".join(line for line in lines if line)


# -- rate limits -----------------------------------------------------------------------


def rate_limit(
    provider: str | None,
    stdout: str,
    stderr: str,
    exit_code: int | None,
    *,
    rate_limit_exit_codes: Collection[int],
    now: datetime,
) -> RateLimitSignal | None:
    """The rate limit a finished step reported (the one detector, on all its output)."""
    return detect_rate_limit(
        output=f"{stdout or ''}\n{stderr or ''}",
        exit_code=exit_code,
        rate_limit_exit_codes=rate_limit_exit_codes,
        now=now,
    )


def _failed_call_lines(provider: str | None, stdout: str, stderr: str) -> list[str]:
    lines: list[str] = []
    if provider == "opencode":
        for line in strip_ansi(stderr or "").splitlines():
            if "level=ERROR" in line:
                lines.append(line)
    elif provider == "codex":
        for line in strip_ansi(stdout or "").splitlines():
            if line.startswith('{"type":"error"') or line.startswith(
                '{"type":"turn.failed"'
            ):
                lines.append(line)
    elif provider == "claude":
        for line in strip_ansi(stdout or "").splitlines():
            event = _claude_retry(line)
            if event is not None and event.get("error_status") == 429:
                # Its wait before the next try, in words the one detector reads as the reset.
                delay = event.get("retry_delay_ms")
                seconds = delay / 1000 if isinstance(delay, int | float) else None
                lines.append(
                    f"{line} retry after {seconds:g} seconds" if seconds else line
                )
    return lines


def live_rate_limit(
    provider: str | None, stdout: str, stderr: str, *, now: datetime
) -> RateLimitSignal | None:
    """A rate limit a still-running agent has already hit (module docstring, "rate
    limits"), or None: claude's `api_retry` event with `error_status` 429 comes before it
    waits for its next try."""
    lines = _failed_call_lines(provider, stdout, stderr)
    if not lines:
        return None
    return detect_rate_limit(
        output="\n".join(lines), exit_code=None, rate_limit_exit_codes=(), now=now
    )


# -- progress and provider errors (module docstring, "progress", "provider errors") -------

_TYPE_RE = re.compile(r'^\{\s*"type"\s*:\s*"([^"]{1,64})"')
# opencode's log line for a failed model call, and the error it names.
_OPENCODE_STREAM_ERROR = 'message="stream error"'
_OPENCODE_ERROR_RE = re.compile(r'error\.error="((?:[^"\\]|\\.)*)"')


def _is_codex_progress(kind: str) -> bool:
    return kind.startswith(("item.", "turn."))


def _is_claude_progress(kind: str) -> bool:
    return kind in ("assistant", "user", "result")


def _is_opencode_progress(kind: str) -> bool:
    return kind.startswith("step_") or kind in ("tool_use", "text")


_PROGRESS = {
    "codex": _is_codex_progress,
    "claude": _is_claude_progress,
    "opencode": _is_opencode_progress,
}


def knows_progress(provider: str | None) -> bool:
    """Whether `provider`'s output tells progress apart (module docstring, "progress")."""
    return (provider or "") in _PROGRESS


def line_progress(provider: str | None, stream: str, line: str) -> bool:
    """Whether one line of a step's output shows progress (module docstring, "progress").
    Only the start of the line is read, so a long event (a command's whole output) costs no
    more."""
    is_progress = _PROGRESS.get(provider or "")
    if is_progress is None:
        return bool(line.strip())
    if stream != "stdout":
        return False
    match = _TYPE_RE.match(line)
    return bool(match and is_progress(match.group(1)))


def progress_summary(provider: str | None, line: str) -> str:
    """A progress line in words: its `summarize_line`, else its event's type."""
    summary = summarize_line(provider, line)
    if summary:
        return summary
    match = _TYPE_RE.match(strip_ansi(line).strip())
    return f"{match.group(1)} event" if match else _short(line, SUMMARY_CHARS)


def _json_event(line: str) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) else None


def _claude_retry(line: str) -> dict[str, Any] | None:
    """claude's `{"type":"system","subtype":"api_retry",...}` event, else None."""
    if not line.startswith("{") or '"api_retry"' not in line[:200]:
        return None
    event = _json_event(line)
    return event if event and event.get("subtype") == "api_retry" else None


def provider_error(provider: str | None, stream: str, line: str) -> str | None:
    """The provider's error when `line` reports a failed model call the CLI retries
    (module docstring, "provider errors"), else None."""
    text = strip_ansi(line).strip()
    try:
        if provider == "opencode" and stream == "stderr":
            if _OPENCODE_STREAM_ERROR not in text:
                return None
            found = _OPENCODE_ERROR_RE.search(text)
            return _short(found.group(1) if found else "stream error", ERROR_CHARS)
        if provider == "codex" and stream == "stdout":
            if not text.startswith('{"type":"error"'):
                return None
            event = _json_event(text)
            return (
                _short(event.get("message") or "error", ERROR_CHARS) if event else None
            )
        if provider == "claude" and stream == "stdout":
            event = _claude_retry(text)
            if event is None:
                return None
            status = event.get("error_status")
            error = event.get("error") or "error"
            return _short(f"{error} (HTTP {status})" if status else error, ERROR_CHARS)
    except Exception:  # reading output never fails a step
        return None
    return None


# -- reasons as one human line (module docstring, `reason_line`) -------------------------

REASON_CHARS = 240
_LOG_FIELD = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"?|\S+)')
_LOG_SKIP = ("timestamp", "level", "run", "service", "session.id", "providerID")
_JSON_TEXT = re.compile(r'"(message|result)"\s*:\s*"((?:[^"\\]|\\.)*)"?')
_JSON_CODE = re.compile(r'"error"\s*:\s*"([^"]*)"')
_JSON_STATUS = re.compile(
    r'"(?:api_error_status|error_status|statusCode|status)"\s*:\s*(\d{3})'
)
# What the runner writes before the detector's raw text (runs.runner).
_COOLDOWN_HEAD = re.compile(r"^(\S+ rate limit) on step \S+ of run \S+: ", re.S)
_RAW_MARK = "; provider rate limit: "
_BARE_CODE = re.compile(r"(?:[\w.]+, )?HTTP \d{3}|[\w.]+")


def _unquote(value: str) -> str:
    if value.startswith('"'):
        value = value[1:-1] if value.endswith('"') and len(value) > 1 else value[1:]
        try:
            return str(json.loads(f'"{value}"'))
        except ValueError:
            return value.replace('\\"', '"')
    return value


def _log_line(text: str) -> str | None:
    """A `key=value` log line (opencode's `--print-logs`) as `error: <message>: <cause>`;
    None for a line that is not one."""
    if not text.startswith("timestamp=") and " level=" not in text[:80]:
        return None
    fields = {key: _unquote(value) for key, value in _LOG_FIELD.findall(text)}
    if "level" not in fields:
        return None
    message = fields.get("message") or fields.get("msg") or ""
    causes = [
        value
        for key, value in fields.items()
        if (key.startswith("error") or key in ("err", "cause")) and value
    ]
    head = fields["level"].lower()
    if not message and not causes:
        rest = [f"{k}={v}" for k, v in fields.items() if k not in _LOG_SKIP]
        return f"{head}: {' '.join(rest)}"
    return ": ".join([head, *([message] if message else []), *causes])


def _json_message(text: str) -> str | None:
    """The provider's message in a JSON event, also when the text was cut mid-way."""
    try:
        event = json.loads(text)
    except (ValueError, RecursionError):
        event = None
    if isinstance(event, dict):
        for path in (
            ("message",),
            ("result",),
            ("error", "message"),
            ("error", "data", "message"),
            ("data", "message"),
        ):
            value: Any = event
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, str) and value.strip():
                return value.strip()
    found = _JSON_TEXT.search(text)
    if found:
        return _unquote(f'"{found.group(2)}"')
    parts = []
    if code := _JSON_CODE.search(text):
        parts.append(code.group(1))
    if status := _JSON_STATUS.search(text):
        parts.append(f"HTTP {status.group(1)}")
    return ", ".join(parts) or None


def _provider_message(raw: str) -> str:
    text = raw.strip()
    if text.startswith("{"):
        return _json_message(text) or text
    return _log_line(text) or text


def reason_line(text: str | None) -> str:
    """One human line for a cooldown's or a step's reason (module docstring,
    `reason_line`); "" for none."""
    try:
        value = strip_ansi(text or "").strip()
        if not value:
            return ""
        head = _COOLDOWN_HEAD.match(value)
        if head:
            line = f"{head.group(1)}: {_provider_message(value[head.end() :])}"
        elif _RAW_MARK in value:
            before, _, raw = value.partition(_RAW_MARK)
            message = _provider_message(raw)
            # A bare code (`rate_limit, HTTP 429`) adds nothing to the agent's own message.
            line = (
                before
                if message in before or (before and _BARE_CODE.fullmatch(message))
                else f"{before} ({message})"
            )
        else:
            line = _provider_message(value)
    except Exception:  # reading a reason never fails a page
        line = text or ""
    return _short(line, REASON_CHARS)
