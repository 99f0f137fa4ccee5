"""The window rows of `ledger.selectors.account_state(windows=True)`: the SQL of the newest
observation per (account, window), packed into that statement's five columns, and reading
them back (docs/windows.md §4)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from domain.windows import Window
from ledger.models import AccountWindow


def aware(value: datetime | str) -> datetime:
    """A timestamp a raw cursor returned, as an aware UTC datetime."""
    # SQLite hands raw cursors the stored text (UTC, naive); PostgreSQL an aware datetime.
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# The newest rate-limit window observation per (account, window), in the same statement
# (`account_state(windows=True)`, after the cooling rows for PostgreSQL's column types), as
# two rows: `window:NAME|SOURCE` with the used fraction in millionths, the status (1 allowed,
# 2 allowed_warning, 3 rejected) and the reset; `seen:NAME` with when it was observed.
_WINDOWS = AccountWindow._meta.db_table
_WINDOW_STATUS = {1: "allowed", 2: "allowed_warning", 3: "rejected"}
_LATEST_WINDOW = f"""
FROM "{_WINDOWS}" w
WHERE w.observed_at >= %s{{names}} AND w.observed_at = (
  SELECT MAX(v.observed_at) FROM "{_WINDOWS}" v
  WHERE v.account_profile = w.account_profile AND v."window" = w."window")"""
WINDOWS_SQL = f"""
SELECT 'window:' || w."window" || '|' || w.source, w.account_profile,
  CAST(ROUND(w.used * 1000000) AS INTEGER),
  CASE w.status WHEN 'allowed' THEN 1 WHEN 'allowed_warning' THEN 2
    WHEN 'rejected' THEN 3 ELSE 0 END,
  w.resets_at{_LATEST_WINDOW}
UNION ALL
SELECT 'seen:' || w."window", w.account_profile, NULL, NULL, w.observed_at{_LATEST_WINDOW}
"""


def window_row(kind: str, used: int | None, status: int | None, resets: Any) -> Window:
    name, _, source = kind[len("window:") :].partition("|")
    return Window(
        name=name,
        used=None if used is None else used / 1_000_000,
        status=_WINDOW_STATUS.get(status or 0),
        resets_at=None if resets is None else aware(resets),
        source=source,
    )


def window_keep_days() -> float:
    """How long a window observation is kept and read (LOOPSWEB_WINDOW_KEEP_DAYS)."""
    return float(settings.LOOPSWEB_WINDOW_KEEP_DAYS)
