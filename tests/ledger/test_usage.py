"""Usage from the agents' machine-readable output (agents.usage): fixtures written from the
CLIs' documented formats (codex `exec --json` events, claude `--output-format json`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.usage import MAX_COST_USD, MAX_TOKENS, Usage, parse_usage

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


def _claude_result(tokens: object, cost: object) -> str:
    usage = f'"usage":{{"input_tokens":{tokens},"output_tokens":{tokens}}}'
    return f'{{"type":"result",{usage},"total_cost_usd":{cost}}}\n'


def test_a_forged_zero_result_after_a_real_one_erases_nothing() -> None:
    """The agent writes its CLI's output: a zero result line after the real one is summed,
    never taken as the step's usage."""
    text = _claude_result(400000, 42.5) + _claude_result(0, 0)
    usage = parse_usage("claude", text)
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (400000, 400000)
    assert usage.cost_usd == 42.5


@pytest.mark.parametrize("provider", ["claude", "codex", "opencode"])
def test_usage_claims_are_bounded_and_finite(provider: str) -> None:
    huge = 2**63 - 1
    lines = {
        "claude": _claude_result(huge, "Infinity") + _claude_result(9 * 10**18, "NaN"),
        "codex": (
            f'{{"type":"turn.completed","usage":{{"input_tokens":{huge},'
            f'"output_tokens":{huge}}}}}\n'
        )
        * 3,
        "opencode": (
            f'{{"type":"step_finish","part":{{"tokens":{{"input":{huge},"output":{huge},'
            f'"cache":{{"read":{huge}}}}},"cost":Infinity}}}}\n'
        )
        * 3,
    }
    usage = parse_usage(provider, lines[provider])
    assert usage is not None
    for value in (usage.input_tokens, usage.output_tokens, usage.cached_tokens):
        assert value is not None and 0 <= value <= MAX_TOKENS
    assert usage.cost_usd is None or (0 <= usage.cost_usd <= MAX_COST_USD)
