"""Loop-level retries (docs/upstream.md §2.1, §2.2): option parsing and the backoff (pure).

A failed or timed-out run whose loop has attempts left runs again after
`retry_backoff_seconds(base, failures, cap)`: base × 2^(failures − 1), capped. The first
retry waits `base`, the second 2 × base, and so on; `base` 0 retries at once.
"""

from __future__ import annotations

import re

from domain.bounds import BOUNDS, bounded_int
from domain.errors import ValidationError

DEFAULT_MAX_ATTEMPTS = 1
# Upstream's loop default: retryDelayMs 60 000.
DEFAULT_RETRY_BACKOFF_SECONDS = 60
MAX_ATTEMPTS_LIMIT = BOUNDS["--max-attempts"].maximum
RETRY_BACKOFF_LIMIT_SECONDS = BOUNDS["--retry-backoff"].maximum

MAX_ATTEMPTS_INVALID = "--max-attempts must be a positive integer"
MAX_ATTEMPTS_TOO_LARGE = f"--max-attempts must be at most {MAX_ATTEMPTS_LIMIT}"
RETRY_BACKOFF_INVALID = (
    "--retry-backoff must be a non-negative duration in seconds, like 30, 30s, 5m or 1h"
)
RETRY_BACKOFF_TOO_LARGE = (
    f"--retry-backoff must be at most {RETRY_BACKOFF_LIMIT_SECONDS} seconds (7 days)"
)

_DURATION = re.compile(r"^(\d+)([smh]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_max_attempts(value: object) -> int | None:
    """`--max-attempts`: a whole number 1..100 (int or ASCII digits); None when unset."""
    # domain.bounds: the same messages, and no int() of a 5,000-digit text.
    return bounded_int("--max-attempts", value)


def parse_retry_backoff(value: object) -> int | None:
    """`--retry-backoff`: seconds as `N`, `Ns`, `Nm` or `Nh` (int or text); None when unset."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValidationError(RETRY_BACKOFF_INVALID)
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str):
        match = _DURATION.match(value.strip().lower())
        if not match or not value.strip().isascii():
            raise ValidationError(RETRY_BACKOFF_INVALID)
        if len(match.group(1).lstrip("0")) > len(str(RETRY_BACKOFF_LIMIT_SECONDS)):
            raise ValidationError(
                RETRY_BACKOFF_TOO_LARGE
            )  # before int() of a huge text
        seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ValidationError(RETRY_BACKOFF_INVALID)
    if seconds < 0:
        raise ValidationError(RETRY_BACKOFF_INVALID)
    if seconds > RETRY_BACKOFF_LIMIT_SECONDS:
        raise ValidationError(RETRY_BACKOFF_TOO_LARGE)
    return seconds


def retry_backoff_seconds(base: float, failures: int, cap: float) -> float:
    """Seconds to wait before the attempt after `failures` failed ones (exponential, capped)."""
    if base <= 0:
        return 0.0
    exponent = max(0, min(failures - 1, 30))
    return float(min(cap, base * (2**exponent)))


def attempts_left(*, failures: int, max_attempts: int | None) -> bool:
    """`workItemStatusForLoopRun`: retry while the failed attempts are fewer than the max."""
    return failures < (max_attempts or DEFAULT_MAX_ATTEMPTS)
