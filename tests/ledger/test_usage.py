"""Usage from the agents' machine-readable output (ledger.usage): fixtures written from the
CLIs' documented formats (codex `exec --json` events, claude `--output-format json`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.usage import Usage, parse_usage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "usage"


def test_codex_jsonl_usage_sums_the_turns() -> None:
    text = (FIXTURES / "codex-exec-json.jsonl").read_text()
    assert parse_usage("codex", text) == Usage(
        input_tokens=24763, output_tokens=122, cached_tokens=24448, cost_usd=None
    )
    two_turns = text + text.splitlines()[-1] + "\n"
    assert parse_usage("codex", two_turns) == Usage(
        input_tokens=2 * 24763, output_tokens=244, cached_tokens=2 * 24448
    )


def test_claude_json_usage_counts_cache_reads_and_writes_as_input_and_keeps_the_cost() -> (
    None
):
    text = (FIXTURES / "claude-print-json.json").read_text()
    assert parse_usage("claude", text) == Usage(
        input_tokens=18 + 5120 + 13402,
        output_tokens=311,
        cached_tokens=13402,
        cost_usd=0.0421875,
    )


def test_a_dropped_bytes_marker_before_the_tail_does_not_hide_the_usage() -> None:
    text = (FIXTURES / "codex-exec-json.jsonl").read_text()
    tail = "[... 123 earlier bytes dropped ...]\n" + '_id":"x"}\n' + text
    assert parse_usage("codex", tail) is not None


@pytest.mark.parametrize(
    ("provider", "text"),
    [
        ("codex", ""),
        ("codex", "plain text answer\n"),
        ("codex", '{"type":"turn.completed","usage":{"input_tokens":"many"}}'),
        ("codex", '{"type":"turn.completed","usage":{"input_tokens":-5}}'),
        ("claude", "{not json"),
        ("claude", '{"type":"result","usage":null}'),
        ("claude", "[" * 5000),
        ("codewith", (FIXTURES / "codex-exec-json.jsonl").read_text()),
        ("opencode", '{"type":"result","usage":{"input_tokens":1,"output_tokens":1}}'),
    ],
)
def test_output_without_readable_usage_gives_none(provider: str, text: str) -> None:
    assert parse_usage(provider, text) is None
