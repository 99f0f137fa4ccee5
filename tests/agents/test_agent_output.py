"""agents.agent_output on lines the pinned CLIs printed against the stand-in (copied from
their real output; tests/agents/test_real_clis.py produces them live)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agents.agent_output import (
    agent_error,
    knows_progress,
    line_progress,
    live_rate_limit,
    progress_summary,
    provider_error,
    rate_limit,
    reason_line,
    summarize_line,
    summarize_output,
)
from agents.ratelimit import strip_ansi
from agents.usage import Usage, parse_usage

NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)

CODEX_OK = "\n".join(
    [
        '{"type":"thread.started","thread_id":"01a2"}',
        '{"type":"turn.started"}',
        '{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc \\"printf hi > a.txt\\"","aggregated_output":"","exit_code":null,"status":"in_progress"}}',
        '{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Done."}}',
        '{"type":"turn.completed","usage":{"input_tokens":2400,"cached_input_tokens":200,"cache_write_input_tokens":0,"output_tokens":80,"reasoning_output_tokens":0}}',
    ]
)
CODEX_429 = "\n".join(
    [
        '{"type":"turn.started"}',
        '{"type":"error","message":"Reconnecting... 1/1 (exceeded retry limit, last status: 429 Too Many Requests)"}',
        '{"type":"error","message":"exceeded retry limit, last status: 429 Too Many Requests"}',
        '{"type":"turn.failed","error":{"message":"exceeded retry limit, last status: 429 Too Many Requests"}}',
    ]
)
CLAUDE_429 = (
    '{"type":"result","subtype":"success","is_error":true,"api_error_status":429,'
    '"num_turns":1,"result":"API Error: Request rejected (429) · Rate limit reached for '
    'requests. Please try again in 2s.","total_cost_usd":0,"usage":{"input_tokens":0,'
    '"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}'
)
OPENCODE_ERROR = (
    '{"type":"error","timestamp":1796182183590,"sessionID":"ses_1","error":{"name":'
    '"APIError","data":{"message":"Rate limit reached for requests.","statusCode":429,'
    '"isRetryable":true,"responseHeaders":{"content-type":"application/json",'
    '"retry-after":"30"}}}}'
)
OPENCODE_LOG = (
    "timestamp=2026-12-02T03:29:35.410Z level=ERROR run=5442ddd4 "
    'message="stream error" providerID=stub modelID=stub-model '
    'error.error="AI_APICallError: Rate limit reached for requests. Please try again in 30s."'
)
OPENCODE_STEPS = "\n".join(
    [
        '{"type":"step_finish","part":{"reason":"tool-calls","tokens":{"total":1240,"input":1100,"output":40,"reasoning":0,"cache":{"write":0,"read":100}},"cost":0.001}}',
        '{"type":"step_finish","part":{"reason":"stop","tokens":{"total":1240,"input":1100,"output":40,"reasoning":0,"cache":{"write":5,"read":100}},"cost":0.002}}',
    ]
)


def test_the_three_429_formats_are_rate_limits_and_name_their_reset_when_printed() -> (
    None
):
    codex = rate_limit("codex", CODEX_429, "", 1, rate_limit_exit_codes=(), now=NOW)
    assert codex is not None and codex.until is None
    claude = rate_limit("claude", CLAUDE_429, "", 1, rate_limit_exit_codes=(), now=NOW)
    assert claude is not None and claude.until == NOW + timedelta(seconds=2)
    opencode = rate_limit(
        "opencode", OPENCODE_ERROR, "", 1, rate_limit_exit_codes=(), now=NOW
    )
    assert opencode is not None and opencode.until == NOW + timedelta(seconds=30)
    # A successful step that printed the words is no rate limit.
    assert (
        rate_limit("claude", CLAUDE_429, "", 0, rate_limit_exit_codes=(), now=NOW)
        is None
    )


def test_ansi_colour_codes_do_not_hide_a_rate_limit() -> None:
    coloured = "\x1b[91m\x1b[1mError: \x1b[0mRate limit reached for requests\x1b[0m"
    assert strip_ansi(coloured) == "Error: Rate limit reached for requests"
    found = rate_limit("opencode", coloured, "", 1, rate_limit_exit_codes=(), now=NOW)
    assert found is not None and "\x1b" not in found.snippet


def test_a_running_opencode_is_seen_rate_limited_from_its_log_alone() -> None:
    signal = live_rate_limit("opencode", "", f"INFO x\n{OPENCODE_LOG}\n", now=NOW)
    assert signal is not None and signal.until == NOW + timedelta(seconds=30)
    # INFO lines and the JSON stream of a healthy run say nothing.
    assert (
        live_rate_limit("opencode", OPENCODE_STEPS, "level=INFO rate limit", now=NOW)
        is None
    )
    assert live_rate_limit("codex", CODEX_429, "", now=NOW) is not None
    assert live_rate_limit("codex", CODEX_OK, "", now=NOW) is None


def test_the_error_is_the_agents_own_message_with_the_exit_code() -> None:
    assert agent_error("codex", CODEX_429, "", 1) == (
        "exceeded retry limit, last status: 429 Too Many Requests (exit code 1)"
    )
    claude = agent_error("claude", CLAUDE_429, "", 1)
    assert claude is not None and claude.startswith("API Error: Request rejected (429)")
    assert agent_error("opencode", OPENCODE_ERROR, "", 1) == (
        "Rate limit reached for requests. (exit code 1)"
    )
    assert agent_error("codex", CODEX_OK, "", 0) is None
    # No event: the last stderr line that is not start-up noise.
    assert agent_error(
        "codex", "", "boom: config broken\nReading additional input from stdin...\n", 2
    ) == ("boom: config broken (exit code 2)")
    assert agent_error("codex", "{not json", "", 0) is None


def test_live_lines_are_readable() -> None:
    text = summarize_output("codex", CODEX_OK)
    assert '$ /bin/bash -lc "printf hi > a.txt"' in text
    assert "message: Done." in text
    assert "turn done: 2400 tokens in, 80 out" in text
    assert "thread.started" not in text
    line = summarize_line("claude", CLAUDE_429)
    assert line is not None and line.startswith("error: API Error")
    assert summarize_line("opencode", "\x1b[0mplain\x1b[0m") == "plain"
    assert summarize_line("opencode", OPENCODE_ERROR) == (
        "error: Rate limit reached for requests."
    )


def test_opencode_usage_sums_its_steps_and_counts_the_cache_as_input() -> None:
    assert parse_usage("opencode", OPENCODE_STEPS) == Usage(
        input_tokens=1100 + 100 + 1100 + 100 + 5,
        output_tokens=80,
        cached_tokens=200,
        cost_usd=0.003,
    )
    assert parse_usage("codex", CODEX_OK) == Usage(
        input_tokens=2400, output_tokens=80, cached_tokens=200
    )


# Lines the pinned CLIs printed against the stand-in (429, hang and 500 modes).
CLAUDE_RETRY_429 = (
    '{"type":"system","subtype":"api_retry","attempt":1,"max_retries":1,'
    '"retry_delay_ms":30000,"error_status":429,"error":"rate_limit","session_id":"7a72"}'
)
CLAUDE_RETRY_500 = CLAUDE_RETRY_429.replace("429", "500").replace(
    "rate_limit", "server_error"
)
OPENCODE_STREAM_ERROR = (
    'timestamp=2026-12-03T19:15:00.498Z level=ERROR run=3cf3 message="stream error" '
    "providerID=stub modelID=stub-model small=false agent=build mode=primary "
    'error.error="AI_APICallError: The server had an error while processing your request."'
)


def test_claudes_retry_event_is_a_live_rate_limit_with_its_wait_as_the_reset() -> None:
    signal = live_rate_limit("claude", CLAUDE_RETRY_429 + "\n", "", now=NOW)
    assert signal is not None
    assert signal.until == NOW + timedelta(seconds=30)
    # A retry of a server error is no rate limit, and neither is the init line.
    assert live_rate_limit("claude", CLAUDE_RETRY_500 + "\n", "", now=NOW) is None
    assert (
        live_rate_limit("claude", '{"type":"system","subtype":"init"}', "", now=NOW)
        is None
    )


def test_progress_is_a_model_answer_or_a_tool_call_never_a_retry_or_a_log_line() -> (
    None
):
    progress = {
        "codex": [
            '{"type":"item.started","item":{"type":"command_execution"}}',
            '{"type":"turn.completed","usage":{}}',
        ],
        "claude": ['{"type":"assistant","message":{}}', '{"type":"result"}'],
        "opencode": ['{"type":"step_start"}', '{"type":"tool_use"}', '{"type":"text"}'],
    }
    idle = {
        "codex": [
            '{"type":"thread.started","thread_id":"01a2"}',
            '{"type":"error","message":"Reconnecting... 2/5"}',
        ],
        "claude": ['{"type":"system","subtype":"init"}', CLAUDE_RETRY_500],
        "opencode": ['{"type":"error","error":{}}', "not json"],
    }
    for provider, lines in progress.items():
        assert knows_progress(provider)
        assert all(line_progress(provider, "stdout", line) for line in lines), provider
        # Progress comes on stdout: the same text on stderr (a log) is not.
        assert not any(line_progress(provider, "stderr", line) for line in lines)
    for provider, lines in idle.items():
        assert not any(line_progress(provider, "stdout", line) for line in lines), (
            provider
        )
    assert not line_progress("opencode", "stderr", OPENCODE_STREAM_ERROR)
    # A CLI whose output is not known: any line that says something counts.
    assert not knows_progress("codewith")
    assert line_progress("codewith", "stderr", "working...")
    assert not line_progress("codewith", "stdout", "   ")


def test_a_provider_error_is_named_in_the_providers_words() -> None:
    assert provider_error("opencode", "stderr", OPENCODE_STREAM_ERROR) == (
        "AI_APICallError: The server had an error while processing your request."
    )
    assert provider_error("opencode", "stdout", OPENCODE_STREAM_ERROR) is None
    assert (
        provider_error(
            "codex", "stdout", '{"type":"error","message":"Reconnecting... 2/5 (500)"}'
        )
        == "Reconnecting... 2/5 (500)"
    )
    assert provider_error("claude", "stdout", CLAUDE_RETRY_500) == (
        "server_error (HTTP 500)"
    )
    for provider, line in (
        ("codex", '{"type":"turn.started"}'),
        ("claude", '{"type":"assistant"}'),
        ("opencode", "timestamp=... level=WARN message=slow"),
        ("codewith", "error: anything"),
    ):
        assert provider_error(provider, "stdout", line) is None
        assert provider_error(provider, "stderr", line) is None
    # A progress line in words: its summary, else its event's kind.
    assert progress_summary("codex", '{"type":"turn.started"}') == "turn.started event"
    assert progress_summary(
        "codex", '{"type":"item.completed","item":{"type":"agent_message","text":"Hi"}}'
    ) == ("message: Hi")


# What the runner recorded for the real CLIs' 429s (cooldown reasons and step errors, cut
# at the detector's snippet as they were before it kept the whole line).
CLAUDE_RETRY = (
    '{"type":"system","subtype":"api_retry","attempt":1,"max_retries":1,'
    '"retry_delay_ms":15000,"error_status":429,"error":"rate_limit","session_id":"e976'
)


def test_a_reason_is_one_human_line_the_providers_message() -> None:
    run = "of run 01a23d5f22562e1e2fb234e0139c942a"
    codex = CODEX_429.splitlines()[1]
    assert reason_line(f"codex rate limit on step verifier {run}: {codex}") == (
        "codex rate limit: Reconnecting... 1/1 (exceeded retry limit, last status: "
        "429 Too Many Requests)"
    )
    # cut JSON: the code and the status
    assert reason_line(f"claude rate limit on step worker {run}: {CLAUDE_RETRY}") == (
        "claude rate limit: rate_limit, HTTP 429"
    )
    assert reason_line(
        f"opencode rate limit on step verifier {run}: {OPENCODE_LOG}"
    ) == (
        "opencode rate limit: error: stream error: AI_APICallError: Rate limit reached "
        "for requests. Please try again in 30s."
    )
    assert reason_line(OPENCODE_ERROR) == "Rate limit reached for requests."
    # a step's error: the agent's message, the raw text's message only when it adds one
    assert reason_line(
        "API Error: Request rejected (429) (exit code 1); provider rate limit: "
        + CLAUDE_RETRY
    ) == ("API Error: Request rejected (429) (exit code 1)")
    assert reason_line(
        "stopped: the agent hit a provider rate limit and was still retrying; "
        f"provider rate limit: {OPENCODE_LOG}"
    ).endswith(
        "(error: stream error: AI_APICallError: Rate limit reached for requests. "
        "Please try again in 30s.)"
    )
    # plain text stays as it is; nothing is ""; bad input never raises
    assert reason_line("429 (acct-00)") == "429 (acct-00)"
    assert reason_line(None) == "" and reason_line("") == ""
    assert reason_line('{"message": ') == '{"message":'


def test_an_opencode_log_line_reads_as_its_message_and_cause() -> None:
    assert summarize_line("opencode", OPENCODE_LOG) == (
        "error: stream error: AI_APICallError: Rate limit reached for requests. "
        "Please try again in 30s."
    )
    assert summarize_line("opencode", "timestamp=x level=INFO service=bus n=2") == (
        "info: n=2"
    )
    # not a log line: as it is
    assert summarize_line(None, "level up: done") == "level up: done"
