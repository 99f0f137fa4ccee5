"""The agent's own final message in what it printed: pure functions, no Django, no ORM.

What a reader of the run's story wants from a step is what its agent said last, in its own
words (the pull request's "verifier's last message", docs/delivery.md §3), not loopsweb's
summary of an event (`turn done: ... tokens`). Each CLI prints it in its own event
(docs/agents.md):

1. codex `exec --json`: the `text` of the last `item.completed` event whose `item` is an
   `agent_message` (earlier ones are what it said between tool calls);
2. claude `--output-format stream-json` (or `json`): the `result` of its last `result`
   event; a `result` with `is_error` is a failure, not a message. Output cut before the
   `result` gives the text blocks of the last `assistant` message that has any;
3. opencode `run --format json`: the `text` parts of its last model call that wrote any
   (a model call starts at a `step_start` event), joined by blank lines;
4. any other provider prints plain text: its last paragraph (the lines after the last blank
   line), at most PLAIN_LINES lines from the end.

ANSI colour codes are stripped; the message is the agent's text as it is (no summary, no
prefix), stripped of surrounding blank space. None when there is none. Nothing here raises
on bad output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.ratelimit import strip_ansi
from agents.usage import json_objects

__all__ = ["final_message"]

PLAIN_LINES = 20


def _text(value: Any) -> str | None:
    return (value.strip() or None) if isinstance(value, str) else None


def _codex(events: list[dict[str, Any]]) -> str | None:
    for event in reversed(events):
        item = event.get("item")
        if (
            event.get("type") == "item.completed"
            and isinstance(item, dict)
            and item.get("type") == "agent_message"
            and (text := _text(item.get("text")))
        ):
            return text
    return None


def _claude_blocks(event: dict[str, Any]) -> str | None:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return None
    texts = [
        text
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and (text := _text(block.get("text")))
    ]
    return "\n\n".join(texts) or None


def _claude(events: list[dict[str, Any]]) -> str | None:
    for event in reversed(events):
        if event.get("type") == "result":
            return None if event.get("is_error") else _text(event.get("result"))
    for event in reversed(events):
        if event.get("type") == "assistant" and (text := _claude_blocks(event)):
            return text
    return None


def _opencode(events: list[dict[str, Any]]) -> str | None:
    calls: list[list[str]] = [[]]
    for event in events:
        if event.get("type") == "step_start":
            calls.append([])
        elif event.get("type") == "text":
            part = event.get("part")
            text = _text(part.get("text")) if isinstance(part, dict) else None
            if text:
                calls[-1].append(text)
    said = [call for call in calls if call]
    return "\n\n".join(said[-1]) if said else None


_READERS: dict[str, Callable[[list[dict[str, Any]]], str | None]] = {
    "codex": _codex,
    "claude": _claude,
    "opencode": _opencode,
}


def _plain(text: str) -> str | None:
    lines = text.rstrip().splitlines()
    start = len(lines)
    while start > 0 and lines[start - 1].strip() and len(lines) - start < PLAIN_LINES:
        start -= 1
    return "\n".join(lines[start:]).strip() or None


def speaks_json(provider: str | None) -> bool:
    """Whether the provider's headless output is machine-readable events (codex, claude,
    opencode: their final message is one event's text), not plain text."""
    return (provider or "") in _READERS


def final_message(provider: str | None, stdout: str | None) -> str | None:
    """What the agent said last, in its own words (module docstring), or None."""
    try:
        text = strip_ansi(stdout or "")
        reader = _READERS.get(provider or "")
        if reader is None:
            return _plain(text)
        return reader(json_objects(text))
    except Exception:  # reading output never fails its reader
        return None
