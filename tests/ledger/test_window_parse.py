"""Windows from what the CLIs write (agents.window_parse): the line shapes codex 0.171,
Claude Code 2.1.197 and opencode 1.18.33 wrote against a stand-in sending the window headers
(docs/windows.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from agents.window_parse import (
    SOURCE_CLAUDE,
    SOURCE_CODEX,
    SOURCE_OPENCODE,
    claude_stream_windows,
    codex_rollout_windows,
    codex_thread_id,
    header_windows,
    opencode_error_windows,
    window_name,
)

RESET_5H = 1796312755
RESET_7D = 1796564755


def at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def token_count(rate_limits) -> str:
    return json.dumps(
        {
            "timestamp": "2026-12-03T13:45:56.574Z",
            "ordinal": 13,
            "type": "event_msg",
            "payload": {
                "type": "token_count",
                "info": {"total_token_usage": {"input_tokens": 10498}},
                "rate_limits": rate_limits,
            },
        }
    )


CODEX_42 = {
    "limit_id": "codex",
    "limit_name": None,
    "primary": {"used_percent": 42.0, "window_minutes": 300, "resets_at": RESET_5H},
    "secondary": {"used_percent": 17.0, "window_minutes": 10080, "resets_at": RESET_7D},
    "credits": {"has_credits": False, "unlimited": False, "balance": None},
    "plan_type": None,
}


def test_codex_rollout_gives_both_windows_of_the_last_answer() -> None:
    later = dict(CODEX_42, primary={**CODEX_42["primary"], "used_percent": 55.5})
    text = "\n".join(
        [
            '{"type":"session_meta","payload":{}}',
            token_count(CODEX_42),
            '{"type":"response_item","payload":{"type":"message"}}',
            token_count(later),
        ]
    )
    got = {w.name: w for w in codex_rollout_windows(text)}
    assert set(got) == {"5h", "7d"}
    assert got["5h"].used == pytest.approx(0.555)
    assert got["5h"].resets_at == at(RESET_5H)
    assert got["7d"].used == pytest.approx(0.17)
    assert got["7d"].resets_at == at(RESET_7D)
    assert got["5h"].source == SOURCE_CODEX


def test_codex_rollout_without_headers_has_no_window_and_a_429_reads_100() -> None:
    empty = {"primary": None, "secondary": None, "credits": None}
    assert codex_rollout_windows(token_count(empty)) == []
    spent = {
        "primary": {"used_percent": 100.0, "window_minutes": 300, "resets_at": RESET_5H}
    }
    text = token_count(CODEX_42) + "\n" + token_count(spent) + "\n" + token_count(empty)
    (window,) = codex_rollout_windows(text)  # the last line WITH a snapshot
    assert (window.name, window.used) == ("5h", 1.0)


def test_codex_thread_id_comes_from_thread_started() -> None:
    out = (
        'warning: PATH alias\n{"type":"thread.started","thread_id":"0199a1b2-c3d4"}\n'
        '{"type":"turn.started"}\n'
    )
    assert codex_thread_id(out) == "0199a1b2-c3d4"
    assert codex_thread_id('{"type":"thread.started","thread_id":"../x"}') is None
    assert codex_thread_id("") is None


def claude_event(info) -> str:
    return json.dumps(
        {
            "type": "rate_limit_event",
            "rate_limit_info": info,
            "uuid": "u",
            "session_id": "s",
        }
    )


def test_claude_events_allowed_then_warning_then_rejected() -> None:
    allowed = {
        "status": "allowed",
        "resetsAt": 1796312694,
        "rateLimitType": "five_hour",
        "overageStatus": "rejected",
        "overageDisabledReason": "org_level_disabled",
        "isUsingOverage": False,
    }
    (first,) = claude_stream_windows(claude_event(allowed))
    assert (first.name, first.status, first.used) == ("5h", "allowed", None)
    assert first.resets_at == at(1796312694)
    assert first.source == SOURCE_CLAUDE
    warning = {
        "status": "allowed_warning",
        "resetsAt": 1796312707,
        "rateLimitType": "five_hour",
        "utilization": 0.93,
        "isUsingOverage": False,
        "surpassedThreshold": 0.9,
    }
    rejected = dict(allowed, status="rejected", resetsAt=1796312707)
    lines = [
        '{"type":"system","subtype":"init"}',
        claude_event(allowed),
        '{"type":"assistant","message":{}}',
        claude_event(warning),
    ]
    (mid,) = claude_stream_windows("\n".join(lines))
    assert (mid.status, mid.used) == ("allowed_warning", 0.93)
    (last,) = claude_stream_windows("\n".join([*lines, claude_event(rejected)]))
    assert last.status == "rejected"


def test_claude_keeps_one_window_per_type() -> None:
    week = {"status": "allowed", "resetsAt": RESET_7D, "rateLimitType": "seven_day"}
    five = {"status": "allowed", "resetsAt": RESET_5H, "rateLimitType": "five_hour"}
    got = claude_stream_windows(claude_event(five) + "\n" + claude_event(week))
    assert sorted(w.name for w in got) == ["5h", "7d"]


def test_opencode_error_line_gives_the_headers_windows() -> None:
    line = {
        "type": "error",
        "timestamp": 1796305727856,
        "sessionID": "ses_1",
        "error": {
            "name": "APIError",
            "data": {
                "message": "The usage limit has been reached",
                "statusCode": 429,
                "isRetryable": True,
                "responseHeaders": {
                    "retry-after": "5",
                    "x-codex-primary-reset-at": "1796312893",
                    "x-codex-primary-used-percent": "100.0",
                    "x-codex-primary-window-minutes": "300",
                    "x-ratelimit-remaining-requests": "0",
                },
                "responseBody": '{"error": {"type": "usage_limit_reached"}}',
            },
        },
    }
    out = '{"type":"step_start"}\n' + json.dumps(line) + "\n"
    (window,) = opencode_error_windows(out)
    assert (window.name, window.used, window.source) == ("5h", 1.0, SOURCE_OPENCODE)
    assert window.resets_at == at(1796312893)
    assert opencode_error_windows('{"type":"step_finish","part":{}}') == []


def test_anthropic_unified_headers() -> None:
    got = {
        w.name: w
        for w in header_windows(
            {
                "anthropic-ratelimit-unified-status": "allowed_warning",
                "anthropic-ratelimit-unified-reset": str(RESET_5H),
                "anthropic-ratelimit-unified-representative-claim": "five_hour",
                "anthropic-ratelimit-unified-5h-utilization": "0.93",
                "anthropic-ratelimit-unified-5h-reset": str(RESET_5H),
                "anthropic-ratelimit-unified-7d-utilization": "0.17",
                "anthropic-ratelimit-unified-7d-reset": str(RESET_7D),
            }
        )
    }
    assert got["5h"].used == pytest.approx(0.93)
    assert got["5h"].status == "allowed_warning"
    assert got["7d"].used == pytest.approx(0.17) and got["7d"].status is None
    assert got["7d"].resets_at == at(RESET_7D)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "not json\n{",
        '{"type":"rate_limit_event","rate_limit_info":"x"}',
        '{"type":"rate_limit_event","rate_limit_info":{"resetsAt":"soon","utilization":true}}',
        token_count({"primary": {"used_percent": "x", "window_minutes": 300}}),
        token_count({"primary": {"used_percent": 5, "resets_at": 10**20}}),
    ],
)
def test_bad_lines_never_raise(bad: str) -> None:
    for parse in (codex_rollout_windows, claude_stream_windows, opencode_error_windows):
        for window in parse(bad):
            assert window.used is None or 0.0 <= window.used <= 1.0
            assert window.resets_at is None or window.resets_at.year < 10000


@pytest.mark.parametrize(
    ("minutes", "name", "expected"),
    [
        (300, None, "5h"),
        (10080, None, "7d"),
        (90, None, "90m"),
        (None, "five_hour", "5h"),
        (None, "seven_day_opus", "seven_day_opus"),
        (None, None, None),
    ],
)
def test_window_names(minutes, name, expected) -> None:
    assert window_name(minutes, name) == expected
