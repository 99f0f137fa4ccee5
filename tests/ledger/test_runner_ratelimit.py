"""Rate-limit detection and backoff: pure functions, no database."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from agents.ratelimit import MAX_DEADLINE, cooldown_backoff, detect_rate_limit

NOW = datetime(2026, 7, 5, 12, 0, 0, tzinfo=UTC)


def _detect(
    output: str, exit_code: int | None = 1, codes: frozenset[int] = frozenset()
):
    return detect_rate_limit(
        output=output, exit_code=exit_code, rate_limit_exit_codes=codes, now=NOW
    )


@pytest.mark.parametrize(
    ("output", "until"),
    [
        ("HTTP 429\nRetry-After: 30", NOW + timedelta(seconds=30)),
        (
            "status: 429 Too Many Requests\nretry-after: 2.5",
            NOW + timedelta(seconds=2.5),
        ),
        (
            "HTTP/1.1 429\nRetry-After: Sun, 05 Jul 2026 12:10:00 GMT",
            NOW + timedelta(minutes=10),
        ),
        (
            "Rate limit reached. Please retry after 45 seconds.",
            NOW + timedelta(seconds=45),
        ),
        ("rate_limit_error: try again in 3 minutes", NOW + timedelta(minutes=3)),
        (
            "Rate-limited; try again in 1 hour and 30 minutes",
            NOW + timedelta(minutes=90),
        ),
        (
            "You've hit your usage limit. Resets at 2026-07-05T15:00:00Z",
            NOW + timedelta(hours=3),
        ),
        ("usage limit; resets at 2026-07-05 14:00 UTC", NOW + timedelta(hours=2)),
        ("usage limit; resets at 2026-07-05T13:00:00+00:00", NOW + timedelta(hours=1)),
        ("Too Many Requests", None),
        ("Usage Limit exceeded for this account", None),
        # Several hints: the latest wins; a hint already in the past is ignored.
        (
            "rate limit: retry after 10s\nresets at 2026-07-05T11:00:00Z\ntry again in 2 minutes",
            NOW + timedelta(minutes=2),
        ),
        # A far-off reset is clamped.
        ("usage limit, resets at 2027-01-01T00:00:00Z", NOW + MAX_DEADLINE),
    ],
)
def test_rate_limits_are_detected_with_the_deadline_they_name(
    output: str, until: datetime | None
) -> None:
    signal = _detect(output)
    assert signal is not None
    assert signal.until == until


def test_a_clock_time_of_the_current_minute_is_its_end_not_tomorrow() -> None:
    """codex names the reset in minutes ("try again at 7:52 PM"): printed within that
    minute, the reset is at most its end; a minute already over is tomorrow's."""
    local = (NOW + timedelta(seconds=20)).astimezone()
    said = local.strftime("%I:%M %p").lstrip("0")
    signal = detect_rate_limit(
        output=f"You've hit your usage limit. try again at {said}.",
        exit_code=1,
        rate_limit_exit_codes=frozenset(),
        now=NOW + timedelta(seconds=20),
    )
    assert signal is not None and signal.until == NOW + timedelta(minutes=1)
    before = (NOW - timedelta(minutes=1)).astimezone().strftime("%I:%M %p").lstrip("0")
    signal = _detect(f"usage limit; try again at {before}")
    assert signal is not None
    assert signal.until == NOW - timedelta(minutes=1) + timedelta(days=1)


@pytest.mark.parametrize(
    ("said", "until"),
    [
        # codex at 23:45 New York time, its reset half an hour later, on the next day:
        # the date comes with the clock time, both the machine's local time (EDT, UTC-4).
        ("Jul 1st, 2026 12:15 AM", datetime(2026, 7, 1, 4, 15, tzinfo=UTC)),
        ("Jul 3rd, 2026 3:05 PM", datetime(2026, 7, 3, 19, 5, tzinfo=UTC)),
        ("July 2nd 2026 9:00 AM", datetime(2026, 7, 2, 13, 0, tzinfo=UTC)),
        # A date that does not exist names no deadline (the backoff applies).
        ("Feb 30th, 2026 1:00 AM", None),
        ("Foo 3rd, 2026 1:00 AM", None),
    ],
)
def test_a_reset_on_another_day_is_read_with_its_date_in_local_time(
    said: str, until: datetime | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A POSIX rule, not a zoneinfo name: no tzdata needed.
    monkeypatch.setenv("TZ", "EST5EDT,M3.2.0,M11.1.0")
    time.tzset()
    try:
        signal = detect_rate_limit(
            output=f"You’ve hit your usage limit. Upgrade to Pro, or try again at {said}.",
            exit_code=1,
            rate_limit_exit_codes=frozenset(),
            now=datetime(2026, 7, 1, 3, 45, tzinfo=UTC),
        )
    finally:
        monkeypatch.undo()
        time.tzset()
    assert signal is not None and signal.until == until


@pytest.mark.parametrize(
    "output",
    [
        "Error: file not found",
        "build failed at line 429",
        "limit reached for tokens in context",
        "",
    ],
)
def test_ordinary_failures_are_not_rate_limits(output: str) -> None:
    assert _detect(output) is None


def test_text_alone_after_success_is_not_a_rate_limit_but_a_configured_exit_code_is() -> (
    None
):
    assert _detect("implemented a rate limit (HTTP 429)", exit_code=0) is None
    by_code = _detect("quota hit", exit_code=42, codes=frozenset({42}))
    assert by_code is not None and by_code.until is None
    assert by_code.snippet == "exit code 42"
    with_text = _detect(
        "usage limit: try again in 1 minute", exit_code=42, codes=frozenset({42})
    )
    assert with_text is not None and with_text.until == NOW + timedelta(minutes=1)
    assert (
        _detect("rate limit", exit_code=None) is not None
    )  # killed by a signal: still failed


def test_the_snippet_is_the_matching_line_bounded() -> None:
    signal = _detect("starting\n  Error: HTTP 429 Too Many Requests  \nbye")
    assert signal is not None and signal.snippet == "Error: HTTP 429 Too Many Requests"
    long = _detect("rate limit " + "x" * 2000)
    assert long is not None and len(long.snippet) == 1000


def test_backoff_doubles_per_report_and_is_capped() -> None:
    delays = [
        cooldown_backoff(reports=n, base_seconds=60, cap_seconds=3600).total_seconds()
        for n in range(1, 9)
    ]
    assert delays == [60, 120, 240, 480, 960, 1920, 3600, 3600]
    assert cooldown_backoff(reports=0, base_seconds=60, cap_seconds=3600) == timedelta(
        seconds=60
    )
    assert cooldown_backoff(reports=10_000, base_seconds=1, cap_seconds=5) == timedelta(
        seconds=5
    )
