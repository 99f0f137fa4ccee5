"""agents.agent_message: the agent's own final message, in each CLI's format (the lines as
the pinned CLIs print them, docs/agents.md; tests/agents/test_real_clis.py checks the same
against the real CLIs). No database, no process."""

from __future__ import annotations

import json
from pathlib import Path

from agents.agent_message import PLAIN_LINES, final_message

USAGE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "usage"


def _lines(*events: dict[str, object]) -> str:
    return "\n".join(json.dumps(event) for event in events) + "\n"


def test_codex_says_its_last_agent_message_not_the_turns_usage() -> None:
    stdout = (USAGE_FIXTURES / "codex-exec-json.jsonl").read_text()
    assert final_message("codex", stdout) == "Fixed the build: the import was missing."
    # What it said between tool calls is not its last word.
    earlier = _lines(
        {
            "type": "item.completed",
            "item": {"type": "agent_message", "text": "Looking"},
        },
        {"type": "item.completed", "item": {"type": "command_execution"}},
        {
            "type": "item.completed",
            "item": {"type": "agent_message", "text": "All checks pass.\n\nShipped."},
        },
        {
            "type": "turn.completed",
            "usage": {"input_tokens": 21419, "output_tokens": 97},
        },
    )
    assert final_message("codex", earlier) == "All checks pass.\n\nShipped."
    assert final_message("codex", _lines({"type": "turn.started"})) is None


def test_claude_says_its_result_and_a_failure_is_no_message() -> None:
    stdout = (USAGE_FIXTURES / "claude-print-json.json").read_text()
    assert final_message("claude", stdout) == "Fixed the build: the import was missing."
    stream = _lines(
        {"type": "system", "subtype": "init", "model": "m"},
        {
            "type": "assistant",
            "message": {"content": [{"type": "text", "text": "Reading it."}]},
        },
        {"type": "result", "is_error": False, "result": "Verified: README is there."},
    )
    assert final_message("claude", stream) == "Verified: README is there."
    failed = _lines({"type": "result", "is_error": True, "result": "Not logged in"})
    assert final_message("claude", failed) is None
    # Output cut before the result: the last assistant text.
    cut = _lines(
        {
            "type": "assistant",
            "message": {
                "content": [
                    {"type": "text", "text": "First."},
                    {"type": "tool_use", "name": "Write"},
                    {"type": "text", "text": "Second."},
                ]
            },
        },
        {"type": "user", "message": {"content": [{"type": "tool_result"}]}},
    )
    assert final_message("claude", cut) == "First.\n\nSecond."


def test_opencode_says_the_text_of_its_last_model_call_that_wrote_any() -> None:
    stdout = _lines(
        {"type": "step_start", "part": {}},
        {"type": "text", "part": {"type": "text", "text": "I will write it."}},
        {"type": "tool_use", "part": {"tool": "write", "state": {"status": "ok"}}},
        {"type": "step_finish", "part": {"reason": "tool-calls"}},
        {"type": "step_start", "part": {}},
        {"type": "text", "part": {"type": "text", "text": "Done: the file"}},
        {"type": "text", "part": {"type": "text", "text": "is written."}},
        {"type": "step_finish", "part": {"reason": "stop"}},
        {"type": "step_start", "part": {}},
        {"type": "step_finish", "part": {"reason": "stop"}},
    )
    assert final_message("opencode", stdout) == "Done: the file\n\nis written."
    assert final_message("opencode", _lines({"type": "error", "error": {}})) is None


def test_plain_output_says_its_last_paragraph_and_bad_output_says_nothing() -> None:
    stdout = "FAKE_AGENT_ARGV []\nworking\n\nAll checks pass.\nShip it.\n\n"
    assert final_message("codewith", stdout) == "All checks pass.\nShip it."
    long = "\n".join(f"line {n}" for n in range(PLAIN_LINES + 5))
    said = final_message(None, long)
    assert said is not None and len(said.splitlines()) == PLAIN_LINES
    assert said.endswith(f"line {PLAIN_LINES + 4}")
    assert final_message("codewith", "\x1b[1mDone.\x1b[0m") == "Done."
    assert final_message("codewith", "") is None
    for provider in ("codex", "claude", "opencode"):
        assert final_message(provider, "") is None
        assert final_message(provider, "{not json\n[1, 2]\nplain words\n") is None
