"""`since` of the "Needs attention" and "Delivered" lists (routing.worklists): a duration
back from now or a UTC date or time, anything else refused with the reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.forms import ValidationError

from routing.worklists import SINCE_INVALID, parse_since

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("24h", NOW - timedelta(hours=24)),
        ("7d", NOW - timedelta(days=7)),
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
        ("2026-11-29T10:30:00Z", datetime(2026, 11, 29, 10, 30, tzinfo=UTC)),
        ("2026-11-29T12:30:00+02:00", datetime(2026, 11, 29, 10, 30, tzinfo=UTC)),
    ],
)
def test_since_reads_durations_and_utc_times(text, moment) -> None:
    assert parse_since(text, now=NOW) == moment


@pytest.mark.parametrize(
    "text",
    [
        "yesterday",
        "24",
        "-1d",
        "3651d",
        "1969-12-31",
        "2027-01-01",
        "7 d",
        "１２h",
        "0001-01-01T00:00:00+01:00",
    ],
)
def test_since_refuses_anything_else(text) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_since(text, now=NOW)
    assert refused.value.messages == [SINCE_INVALID]
