"""Waiting in tests: the one polling helper and the one time scale.

A test waits for a condition, never for a length of time, and the deadline it gives is a
hang deadline: long enough that only something stuck reaches it on the busiest machine the
suite runs on (minutes, not seconds). How long a thing took is a benchmark's figure
(tests/bench/), never a test's assertion; tests/test_suite_rules.py enforces both.

LOOPSWEB_TEST_TIME_SCALE (a positive float, default 1) multiplies every hang deadline: set it
above 1 on a machine slower or busier than usual. It is read here and nowhere else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIME_SCALE_ENV = "LOOPSWEB_TEST_TIME_SCALE"
# The default hang deadline, before scaling: nothing the suite waits for takes this long
# unless it is stuck.
HANG_SECONDS = 300.0
# What tests/test_suite_rules.py accepts as a hang deadline (before scaling): an assertion
# that a measured duration is below less than this is a timing assertion.
MIN_HANG_SECONDS = 60.0


def time_scale() -> float:
    """LOOPSWEB_TEST_TIME_SCALE as a float (default 1); anything else stops the run."""
    raw = os.environ.get(TIME_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        raise RuntimeError(
            f"{TIME_SCALE_ENV} must be a positive number, got {raw!r}"
        ) from None
    if not scale > 0 or scale == float("inf"):
        raise RuntimeError(f"{TIME_SCALE_ENV} must be a positive number, got {raw!r}")
    return scale


def hang_deadline(seconds: float = HANG_SECONDS) -> float:
    """`seconds` (a hang deadline) times the time scale."""
    return seconds * time_scale()


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float = HANG_SECONDS,
    interval: float = 0.1,
    what: str = "the condition",
) -> T:
    """Call `condition` every `interval` s until it returns something truthy, and return it.

    Fails after `timeout` s times the time scale (a hang deadline), naming `what` and the
    last value the condition returned. An exception from the condition propagates at once.
    """
    limit = hang_deadline(timeout)
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {limit:.0f} s waiting for {what}; "
                f"last value seen: {value!r:.500}"
            )
        time.sleep(interval)
