"""Upper (and lower) bounds of every numeric option and setting: one table, one parser.

Every numeric command option, schedule option, API query parameter and numeric setting
(`loopsweb.settings` reads the environment through it) is parsed here, so a value too large
for the code or the database (a 5,000-digit number, a bigint or smallint overflow, a timeout
that overflows the clock) is a clear error naming the option or variable and its bound,
before anything runs. docs/options.md ("Numeric bounds") and docs/settings.md list this table
(tests/test_settings_docs.py keeps them equal); a new numeric option or setting adds a row
and calls `bounded_int` (commands: `option_type`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from domain.errors import (
    LIMIT_NOT_NON_NEGATIVE,
    LIMIT_NOT_POSITIVE,
    ValidationError,
)

LIMIT_TOO_LARGE = "{flag} must be at most {maximum}"
LIMIT_TOO_SMALL = "{flag} must be at least {minimum}"


class TooLarge(ValidationError):
    """A number above its bound (LIMIT_TOO_LARGE); `maximum` is the bound it broke."""

    def __init__(self, flag: str, maximum: int) -> None:
        super().__init__(LIMIT_TOO_LARGE.format(flag=flag, maximum=maximum))
        self.maximum = maximum


@dataclass(frozen=True)
class Bound:
    minimum: int
    maximum: int


DAY = 24 * 3600
WEEK = 7 * DAY
YEAR = 365 * DAY
MIB = 1024 * 1024
GIB = 1024 * MIB
CAP = Bound(1, 100_000)
BOUNDS: dict[str, Bound] = {
    # route options (route_event, drain, schedule_drain, the API's route=now)
    "--max-active": CAP,
    "--max-active-per-project": CAP,
    "--max-active-per-project-group": CAP,
    "--max-per-profile": Bound(0, 100_000),
    # drain options
    "--max-dispatch": Bound(1, 100_000),
    "--limit": Bound(1, 100_000),
    "--scan-limit": Bound(1, 10_000_000),
    "--source-timeout": Bound(1, 86_400),  # seconds: a day
    # schedule_drain: django-q2 stores minutes in a smallint
    "--every": Bound(1, 32_767),
    # loop-level retries (domain.retry)
    "--max-attempts": Bound(1, 100),
    "--retry-backoff": Bound(0, WEEK),  # seconds: a week
    # revisions of an item (domain.revisions): 0 turns them off
    "--max-revisions": Bound(0, 20),
    # agent step time limits (route options), seconds: 30 days
    "--step-timeout": Bound(1, 30 * DAY),
    "--step-idle-timeout": Bound(1, 30 * DAY),
    # other commands' options (a flag two commands use differently is keyed by command)
    "--keep-seconds": Bound(0, 10 * YEAR),  # prune_worktrees
    "--days": Bound(1, 36_500),  # prune_drains: a hundred years
    "--max-running": CAP,  # account add
    "routes --limit": Bound(1, 1_000),  # routes list / invocations
    "loop --limit": Bound(1, 1_000),  # loop list
    "--expires": Bound(
        1, 10 * YEAR
    ),  # api_token create: seconds (given as 90d, 12h, ...)
    # settings: environment variables (loopsweb.settings.env.env_int)
    "SQLITE_BUSY_TIMEOUT": Bound(1, 3_600),  # seconds
    "DATABASE_CONN_MAX_AGE": Bound(0, DAY),  # seconds
    "LOOPSWEB_LOGIN_FAILURE_LIMIT": Bound(1, 1_000),
    "LOOPSWEB_LOGIN_IP_FAILURE_LIMIT": Bound(1, 100_000),
    "LOOPSWEB_LOGIN_COOLOFF_MINUTES": Bound(1, 525_600),  # a year
    "LOOPSWEB_HSTS_SECONDS": Bound(0, 2 * YEAR),
    "Q_TIMEOUT": Bound(1, WEEK),  # seconds
    "Q_RETRY": Bound(2, WEEK + DAY),  # seconds; must also exceed Q_TIMEOUT
    "Q_WORKERS": Bound(1, 1_000),
    "LOOPSWEB_RUN_WORKERS": Bound(1, 1_000),
    "LOOPSWEB_MAX_EVENT_BYTES": Bound(1_024, 64 * MIB),
    "LOOPSWEB_RUN_LEASE_SECONDS": Bound(1, DAY),
    "LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS": Bound(1, 36_500),
    "LOOPSWEB_WINDOW_KEEP_DAYS": Bound(1, 366),
    "LOOPSWEB_OUTPUT_TAIL_BYTES": Bound(1_024, 64 * MIB),
    "LOOPSWEB_COOLDOWN_BASE_SECONDS": Bound(1, DAY),
    "LOOPSWEB_COOLDOWN_CAP_SECONDS": Bound(1, 30 * DAY),
    "LOOPSWEB_STEP_START_POLL_SECONDS": Bound(1, 3_600),
    "LOOPSWEB_KILL_GRACE_SECONDS": Bound(0, 3_600),
    "LOOPSWEB_RATE_LIMIT_MOVES": Bound(0, 100),
    "LOOPSWEB_AGENT_MAX_RETRIES": Bound(0, 20),
    "LOOPSWEB_STEP_TIMEOUT_SECONDS": Bound(1, 30 * DAY),
    "LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS": Bound(1, 30 * DAY),
    "LOOPSWEB_STEP_PROVIDER_ERRORS": Bound(1, 100),
    "LOOPSWEB_POOL_WAIT_SECONDS": Bound(0, WEEK),
    "LOOPSWEB_THROTTLE_SECONDS": Bound(0, 3600),
    "LOOPSWEB_UNRESPONSIVE_SECONDS": Bound(1, WEEK),
    "LOOPSWEB_OUTPUT_FLUSH_SECONDS": Bound(1, 3_600),
    "LOOPSWEB_WEB_WORKERS": Bound(1, 64),
    "LOOPSWEB_WEB_THREADS": Bound(1, 64),
    "LOOPSWEB_WEB_TIMEOUT": Bound(5, 3_600),  # seconds
    "LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS": Bound(0, WEEK),
    "LOOPSWEB_MAX_REDISPATCH": Bound(0, 1_000),
    "LOOPSWEB_WORKTREE_KEEP_SECONDS": Bound(0, 10 * YEAR),
    "LOOPSWEB_BRANCH_KEEP_SECONDS": Bound(0, 10 * YEAR),
    "LOOPSWEB_PR_STATE_CACHE_SECONDS": Bound(0, DAY),
    "LOOPSWEB_REVISION_DEBOUNCE_SECONDS": Bound(0, DAY),
    "LOOPSWEB_GITHUB_WEBHOOK_MAX_BYTES": Bound(1_024, 64 * MIB),
    "LOOPSWEB_MAX_INGEST_BYTES": Bound(1_024, 4 * GIB),
    "LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS": Bound(0, 3_600),
    "LOOPSWEB_DRAIN_BATCH_SIZE": Bound(1, 10_000),
    "LOOPSWEB_INGEST_WAKE_SECONDS": Bound(0, 3_600),
    "LOOPSWEB_SOURCE_MAX_BYTES": Bound(1_024, GIB),
    "LOOPSWEB_API_MAX_EVENTS": Bound(1, 100_000),
    # below Python's recursion limit (1,000), which the JSON parser would otherwise hit
    "LOOPSWEB_MAX_JSON_DEPTH": Bound(2, 500),
    # a provider's rate-limit exit codes (LOOPSWEB_<PROVIDER>_RATE_LIMIT_EXIT_CODES)
    "rate-limit exit code": Bound(0, 255),
    # settings of several machines (loopsweb.settings, ledger.hosts)
    "LOOPSWEB_HOST_DEAD_SECONDS": Bound(15, DAY),  # above the 10 s heartbeat
    "LOOPSWEB_NO_HOST_GRACE_SECONDS": Bound(1, WEEK),
    # the admission lock's limits (ledger.lock): a hung holder is cut off, a wait gives up
    "LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS": Bound(1, 600),
    "LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS": Bound(1, 600),
}


def bounded_int(
    flag: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    key: str | None = None,
) -> int | None:
    """Parse a whole number given as int or decimal text, within the bounds of `flag`.

    ``None`` and blank text mean "unset" (None). Floats, bools, signs, non-ASCII digits and
    numbers outside [minimum, maximum] raise ValidationError naming the flag (`TooLarge`
    above the maximum). The length of
    the text is checked before int() runs, so no input can make the conversion itself slow
    or fail (Python refuses more than 4,300 digits). `key` names the table row when it is not
    the flag itself (`routes --limit`).
    """
    bound = BOUNDS.get(key or flag)
    low = minimum if minimum is not None else (bound.minimum if bound else 1)
    high = maximum if maximum is not None else (bound.maximum if bound else None)
    if high is None:
        raise ValueError(f"no upper bound known for {flag}")  # a programming error
    message = (LIMIT_NOT_NON_NEGATIVE if low == 0 else LIMIT_NOT_POSITIVE).format(
        flag=flag
    )
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValidationError(message)
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        # isdigit() alone accepts "²" and other non-ASCII digits; require plain ASCII.
        if not (text.isascii() and text.isdigit()):
            raise ValidationError(message)
        text = text.lstrip("0") or "0"
        if len(text) > len(str(high)):
            raise TooLarge(flag, high)
        number = int(text)
    else:
        raise ValidationError(message)
    if number < low:
        if low > 1:
            raise ValidationError(LIMIT_TOO_SMALL.format(flag=flag, minimum=low))
        raise ValidationError(message)
    if number > high:
        raise TooLarge(flag, high)
    return number


def option_type(flag: str, *, key: str | None = None) -> Callable[[str], int]:
    """An argparse `type=` for a numeric command option: `bounded_int` with the table's
    bound, so a bad value is argparse's error naming the option (exit 2), before `handle`."""

    def parse(text: str) -> int:
        try:
            value = bounded_int(flag, text, key=key)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value is None:
            raise argparse.ArgumentTypeError(f"{flag} must not be blank")
        return value

    return parse
