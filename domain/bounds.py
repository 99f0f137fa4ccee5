"""Upper (and lower) bounds of every numeric option: one table, one parser.

Every numeric command option, schedule option and API query parameter is parsed here, so a
value too large for the code or the database (a 5,000-digit number, a bigint or smallint
overflow, a timeout that overflows the clock) is a clear error naming the option and its
bound, before anything runs. README ("Numeric bounds") lists this table; new numeric options
add a row and call `bounded_int`.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.errors import (
    LIMIT_NOT_NON_NEGATIVE,
    LIMIT_NOT_POSITIVE,
    ValidationError,
)

LIMIT_TOO_LARGE = "{flag} must be at most {maximum}"


@dataclass(frozen=True)
class Bound:
    minimum: int
    maximum: int


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
    "--retry-backoff": Bound(0, 7 * 24 * 3600),  # seconds: a week
    # settings of several machines (loopsweb.settings, ledger.hosts)
    "LOOPSWEB_HOST_DEAD_SECONDS": Bound(15, 86_400),  # above the 10 s heartbeat
    "LOOPSWEB_NO_HOST_GRACE_SECONDS": Bound(1, 7 * 24 * 3600),
}


def bounded_int(
    flag: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int | None:
    """Parse a whole number given as int or decimal text, within the bounds of `flag`.

    ``None`` and blank text mean "unset" (None). Floats, bools, signs, non-ASCII digits and
    numbers outside [minimum, maximum] raise ValidationError naming the flag. The length of
    the text is checked before int() runs, so no input can make the conversion itself slow
    or fail (Python refuses more than 4,300 digits).
    """
    bound = BOUNDS.get(flag)
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
            raise ValidationError(LIMIT_TOO_LARGE.format(flag=flag, maximum=high))
        number = int(text)
    else:
        raise ValidationError(message)
    if number < low:
        raise ValidationError(message)
    if number > high:
        raise ValidationError(LIMIT_TOO_LARGE.format(flag=flag, maximum=high))
    return number
