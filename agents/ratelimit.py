"""Provider rate-limit detection and cooldown backoff: pure functions, no ORM (loopsweb).

Contract:
1. ``detect_rate_limit`` looks at an agent step's output tails and exit code, after ANSI
   colour codes are stripped (opencode's default output wraps words in them). It reports a
   rate limit when the exit code is one of the provider's rate-limit codes, or when the
   step failed (non-zero exit, or None: still running) and its output mentions HTTP 429,
   "too many requests", "rate limit" or "usage limit" (case-insensitive). The real CLIs'
   formats (docs/agents.md): codex `last status: 429 Too Many Requests`, claude
   `"api_error_status":429`, opencode `"statusCode":429`. Text alone never cools an account
   after a successful step: a worker that edited rate-limiting code prints those words.
2. When the output names when the limit lifts, the signal carries that deadline: a
   ``Retry-After: <seconds | HTTP-date>`` header (also as JSON, ``"retry-after":"30"``, as
   opencode prints the response headers), "retry after N seconds", "try again in N
   minutes", "resets in N hours", "resets at <ISO time>" or "try again at 4:24 AM" (codex
   on a subscription's usage limit: a clock time in the machine's time zone, the next one
   after now; with its date when the reset is on another day, "try again at Dec 6th, 2026
   12:15 AM"). The latest deadline in the future wins; deadlines further away than
   ``MAX_DEADLINE`` are clamped to it.
3. ``cooldown_backoff`` is the fallback when no deadline was named:
   ``base × 2^(reports−1)``, capped at ``cap`` (reports counts this episode's reports,
   starting at 1).
4. ``detect_login_failure`` is its sibling for a refused login: the step failed (non-zero
   exit, or None) and its output names an authentication error: HTTP 401 (`401
   Unauthorized`, `status 401`, `"api_error_status":401`, `"statusCode":401`), "Not
   logged in", "Invalid API key", "Incorrect API key", `authentication_error`,
   `invalid_api_key`. The real CLIs (docs/agents.md): codex `unexpected status 401
   Unauthorized: ...`, claude `Not logged in · Please run /login`, opencode an `error`
   event with the provider's message ("Incorrect API key provided."). A rate limit is
   never a login failure (the caller asks ``detect_rate_limit`` first).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

# A provider that says "come back in a month" is clamped: an operator can clear a cooldown,
# but a typo'd reset time must not silently park an account for a year.
MAX_DEADLINE = timedelta(days=7)
# The whole matched line, up to this: a log line names the cause at its end (opencode).
SNIPPET_CHARS = 1000

_ANSI_RE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])"
)


def strip_ansi(text: str) -> str:
    """`text` without ANSI escape sequences (colours, cursor moves, OSC titles)."""
    return _ANSI_RE.sub("", text) if "\x1b" in text else text


_RATE_LIMIT_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bHTTP(?:/[\d.]+)?\s*(?:status\s*)?429\b", re.I),
    re.compile(r"\b(?:status|error|code)(?:[ _-]?code)?\W{0,3}429\b", re.I),
    re.compile(r"\b429\s+too\s+many\s+requests\b", re.I),
    re.compile(r"\btoo\s+many\s+requests\b", re.I),
    re.compile(r"\brate[\s_-]?limit", re.I),
    re.compile(r"\busage[\s_-]?limit", re.I),
)

_UNIT_SECONDS = {
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hr": 3600,
    "hrs": 3600,
    "hour": 3600,
    "hours": 3600,
}
_UNIT = r"(?:seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h)\b"
_AMOUNT = rf"(\d+(?:\.\d+)?)\s*({_UNIT})?"
_RETRY_AFTER_HEADER = re.compile(
    r"\bretry-after\"?\s*:\s*(?:\"([^\"\r\n]*)\"|([^\r\n]+))", re.I
)
_RETRY_AFTER_TEXT = re.compile(rf"\bretry(?:ing)?\s+after\s+{_AMOUNT}", re.I)
_IN_DURATION = re.compile(
    rf"\b(?:try\s+again|resets?|available\s+again)\s+in\s+({_AMOUNT}(?:\s*(?:,|and)?\s*{_AMOUNT})*)",
    re.I,
)
_DURATION_PART = re.compile(_AMOUNT, re.I)
_RESETS_AT = re.compile(
    r"\bresets?\s+(?:at|on)\s+"
    r"(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?\s*(?:Z|UTC|[+-]\d{2}:?\d{2})?)",
    re.I,
)


# "try again at 4:24 AM" (today or the next such time), or with its date when the reset is
# on another day: "try again at Dec 6th, 2026 12:15 AM" (codex; English month names).
_MONTHS = "jan feb mar apr may jun jul aug sep oct nov dec".split()
_AT_CLOCK = re.compile(
    r"\b(?:try\s+again|resets?|available\s+again)\s+at\s+"
    r"(?:([A-Za-z]{3})[a-z]*\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4}),?\s+)?"
    r"(\d{1,2}):(\d{2})\s*([AaPp][Mm])?(?![\d:])"
)


def _clock_time(match: re.Match[str], now: datetime) -> datetime | None:
    """The deadline an `_AT_CLOCK` match names, in the machine's time zone (codex prints
    its local time): on the date it names, else the next such time after `now`."""
    month, day, year, hour, minute, meridiem = match.groups()
    hour_of_day = int(hour)
    if meridiem:
        if not 1 <= hour_of_day <= 12:
            return None
        hour_of_day = hour_of_day % 12 + (12 if meridiem.lower() == "pm" else 0)
    if hour_of_day > 23 or int(minute) > 59:
        return None
    if month is not None:
        if month.lower() not in _MONTHS:
            return None
        try:
            dated = datetime(
                int(year),
                _MONTHS.index(month.lower()) + 1,
                int(day),
                hour_of_day,
                int(minute),
            )
        except ValueError:
            return None
        return dated.astimezone().astimezone(UTC)  # naive: the machine's local time
    local = now.astimezone()
    when = local.replace(hour=hour_of_day, minute=int(minute), second=0, microsecond=0)
    if when <= local - timedelta(minutes=1):
        when += timedelta(days=1)
    elif when <= local:
        # The current minute (codex prints minutes): the reset is within it, not tomorrow.
        when += timedelta(minutes=1)
    return when.astimezone(UTC)


@dataclass(frozen=True)
class RateLimitSignal:
    """A rate limit seen in a step's output: the matching text and, when named, the deadline."""

    snippet: str
    until: datetime | None


def _seconds(amount: str, unit: str | None) -> float:
    return float(amount) * _UNIT_SECONDS.get((unit or "s").lower(), 1)


def _parse_iso(text: str) -> datetime | None:
    value = text.strip().replace(" ", "T", 1)
    value = re.sub(r"\s*UTC$", "Z", value, flags=re.I).replace(" ", "")
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    # A reset time without an offset is read as UTC (the ledger's time zone).
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _deadlines(text: str, now: datetime) -> list[datetime]:
    found: list[datetime] = []
    for match in _RETRY_AFTER_HEADER.finditer(text):
        value = (
            match.group(1) if match.group(1) is not None else match.group(2)
        ).strip()
        number = re.match(r"(\d+(?:\.\d+)?)\s*$", value)
        if number:
            found.append(now + timedelta(seconds=float(number.group(1))))
            continue
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            continue
        found.append(when if when.tzinfo else when.replace(tzinfo=UTC))
    for match in _RETRY_AFTER_TEXT.finditer(text):
        found.append(now + timedelta(seconds=_seconds(match.group(1), match.group(2))))
    for match in _IN_DURATION.finditer(text):
        total = sum(
            _seconds(part.group(1), part.group(2))
            for part in _DURATION_PART.finditer(match.group(1))
        )
        found.append(now + timedelta(seconds=total))
    for match in _RESETS_AT.finditer(text):
        reset = _parse_iso(match.group(1))
        if reset is not None:
            found.append(reset)
    for match in _AT_CLOCK.finditer(text):
        reset = _clock_time(match, now)
        if reset is not None:
            found.append(reset)
    return found


def _line_of(output: str, match: re.Match[str]) -> str:
    """The line of `output` that holds `match`, stripped."""
    start = output.rfind("\n", 0, match.start()) + 1
    end = output.find("\n", match.end())
    return output[start : end if end != -1 else len(output)].strip()


def detect_rate_limit(
    *,
    output: str,
    exit_code: int | None,
    rate_limit_exit_codes: Collection[int],
    now: datetime,
) -> RateLimitSignal | None:
    """The rate limit an agent step reported, or None (contract in the module docstring)."""
    output = strip_ansi(output)
    by_exit_code = exit_code is not None and exit_code in rate_limit_exit_codes
    failed = exit_code is None or exit_code != 0
    match = None
    for pattern in _RATE_LIMIT_PATTERNS:
        match = pattern.search(output)
        if match:
            break
    if not by_exit_code and not (failed and match):
        return None
    snippet = _line_of(output, match) if match else f"exit code {exit_code}"
    future = [when for when in _deadlines(output, now) if when > now]
    until = min(max(future), now + MAX_DEADLINE) if future else None
    return RateLimitSignal(snippet=snippet[:SNIPPET_CHARS], until=until)


_LOGIN_FAILURE_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\b401\s+unauthori[sz]ed\b", re.I),
    re.compile(r"\bHTTP(?:/[\d.]+)?\s*(?:status\s*)?401\b", re.I),
    re.compile(r"\b(?:status|error)(?:[ _-]?code)?\W{0,3}401\b", re.I),
    re.compile(r"\b(?:api_error_status|statusCode)\"?\s*:\s*401\b", re.I),
    re.compile(r"\bnot\s+logged\s+in\b", re.I),
    re.compile(r"\b(?:invalid|incorrect)\s+(?:x-)?api[\s_-]?key\b", re.I),
    re.compile(r"\b(?:authentication_error|invalid_api_key)\b", re.I),
)


@dataclass(frozen=True)
class LoginFailureSignal:
    """A refused login seen in a step's output: the line that says so."""

    snippet: str


def detect_login_failure(
    *, output: str, exit_code: int | None
) -> LoginFailureSignal | None:
    """The authentication error a failed agent step reported, or None (module docstring,
    ``detect_login_failure``)."""
    if exit_code == 0:
        return None
    output = strip_ansi(output)
    for pattern in _LOGIN_FAILURE_PATTERNS:
        match = pattern.search(output)
        if match:
            return LoginFailureSignal(snippet=_line_of(output, match)[:SNIPPET_CHARS])
    return None


def cooldown_backoff(
    *, reports: int, base_seconds: float, cap_seconds: float
) -> timedelta:
    """Exponential backoff for the ``reports``-th report of an episode (1-based), capped."""
    exponent = max(0, min(reports - 1, 30))
    return timedelta(seconds=min(cap_seconds, base_seconds * (2**exponent)))
