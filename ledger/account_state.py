"""The pool picture a pool assignment reads, in one statement (`account_state`): the load
per account (running, and reserved by admitted runs not yet started), the cooldowns in force,
the registry limits of the named accounts and their newest rate-limit windows.

Re-exported by `ledger.selectors`, where the other reads that decisions depend on are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection

from domain.pool import HangMark
from domain.windows import Window
from ledger.models import Account, AccountCooldown, AccountLoadCount, AccountWindow

# --- the window rows of `account_state(windows=True)` (docs/windows.md §4) ---------------------


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


# --- the pool picture -----------------------------------------------------------------------


@dataclass(frozen=True)
class AccountLoad:
    """Per-account load: running steps, plus reserved steps of admitted runs not yet started."""

    running: dict[str, int] = field(default_factory=dict)
    reserved: dict[str, int] = field(default_factory=dict)

    def total(self) -> dict[str, int]:
        return dict(Counter(self.running) + Counter(self.reserved))


# One statement for the whole pool picture: the kept load per account (one row per account,
# however many runs are queued: ledger.services.account_loads) and, when asked, the accounts
# still cooling
# down. Rows are (kind, account_profile, running, reserved, until).
_LOADS_SQL = f"""
SELECT 'load', account_profile, running, reserved, NULL
FROM "{AccountLoadCount._meta.db_table}"
WHERE running <> 0 OR reserved <> 0
"""
_COOLING_SQL = f"""
SELECT 'cooling', account_profile, NULL, NULL, "until"
FROM "{AccountCooldown._meta.db_table}"
WHERE "until" > %s
"""


@dataclass(frozen=True)
class AccountLimits(HangMark):
    """What a pool assignment reads of a registered account: whether it takes work, its own
    cap on running steps (None: no cap), its login failed (0014) or unresponsive marks."""

    enabled: bool
    max_running: int | None
    login_failed: bool = False
    # 0021: the operator gave it window budgets (ledger.windows estimates those windows).
    window_budgets: bool = False
    # 0021: its windows are paced (domain/windows.py, "pacing").
    window_pace: bool = False
    unresponsive_until: datetime | None = None


# The registry rows of the named accounts, in the same statement (`account_state(accounts=)`):
# the third column holds enabled (1), login failed (2), has window budgets (4) and paced
# windows (8) as bits.
_LIMITS_SQL = f"""
SELECT 'account', name,
  CASE WHEN enabled THEN 1 ELSE 0 END
  + CASE WHEN login_failed_at IS NULL THEN 0 ELSE 2 END
  + CASE WHEN window_budgets IS NULL THEN 0 ELSE 4 END
  + CASE WHEN window_pace THEN 8 ELSE 0 END,
  max_running, unresponsive_until
FROM "{Account._meta.db_table}"
WHERE name IN ({{marks}})
"""


@dataclass(frozen=True)
class AccountState:
    """Load per account and the accounts cooling down (profile → when it frees); with
    `account_state(accounts=...)`, the registry limits of those accounts that are registered."""

    load: AccountLoad
    cooling: dict[str, datetime]
    limits: dict[str, AccountLimits] = field(default_factory=dict)
    # With `windows=True`: account -> its newest window observations (no estimate).
    windows: dict[str, list[Window]] = field(default_factory=dict)


def account_state(
    *,
    now: datetime | None = None,
    accounts: Iterable[str] | None = None,
    windows: bool = False,
) -> AccountState:
    """Load per account profile, the loopsweb way (load that cannot herd), in one round trip.

    - running: step runs in `running` with an account profile (upstream's count).
    - reserved: for every admitted run that has not started a step yet (still `queued`, or
      claimed by the runner but before its first step starts), its earliest pending step that
      carries an account. Without this, one drain batch could place every item on the same
      idle account before any of them starts.
    - cooling (only with `now`): cooldowns still in force at `now`.
    - limits (only with `accounts`): enabled and max_running of those of the named accounts
      that are registered (as `account_registry(accounts)` reads them).
    - windows (only with `now` and `windows=True`): the newest observation of each
      rate-limit window (of the named accounts, or all) seen within
      LOOPSWEB_WINDOW_KEEP_DAYS (ledger.windows adds the estimates).
    Later steps of a started run count only once they run. Running and reserved are the
    counts kept per account (`ledger.services.account_loads`), equal to a recount of the rows:
    the read costs
    one row per account, not a scan of the queued runs.
    """
    names = sorted({str(n).strip() for n in accounts or ()})
    sql, params = _account_state_query(now, names, windows=windows)
    rows = _AccountRows()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for kind, profile, n_running, n_reserved, until in cursor.fetchall():
            rows.add(kind, profile, n_running, n_reserved, until)
    return rows.state()


def account_load() -> AccountLoad:
    """Running and reserved load per account profile (see `account_state`)."""
    return account_state().load


def _db_datetime(value: datetime) -> str | datetime | None:
    # text on SQLite; PostgreSQL takes the datetime itself
    return connection.ops.adapt_datetimefield_value(value)


def _account_state_query(
    now: datetime | None, names: list[str], *, windows: bool
) -> tuple[str, list[str | datetime | None]]:
    """The statement of `account_state` and its parameters: the loads, the cooldowns in
    force at `now`, the newest windows (of `names`, or all) and the limits of `names`."""
    # The cooling rows come first when present: PostgreSQL types each UNION column from its
    # first typed value, and only that branch has a timestamp.
    parts = [_LOADS_SQL]
    params: list[str | datetime | None] = []
    if now is not None:
        parts.insert(0, _COOLING_SQL)
        params.append(_db_datetime(now))
    if now is not None and windows:
        marks = ", ".join(["%s"] * len(names))
        parts.insert(
            1,
            WINDOWS_SQL.format(
                names=f" AND w.account_profile IN ({marks})" if names else ""
            ),
        )
        since = _db_datetime(now - timedelta(days=window_keep_days()))
        params[1:1] = [since, *names, since, *names]
    if names:
        parts.append(_LIMITS_SQL.format(marks=", ".join(["%s"] * len(names))))
        params += names
    return " UNION ALL ".join(parts), params


class _AccountRows:
    """The rows of `account_state`'s statement, (kind, account_profile, running, reserved,
    until), gathered by kind into an `AccountState`."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.reserved: dict[str, int] = {}
        self.cooling: dict[str, datetime] = {}
        self.limits: dict[str, AccountLimits] = {}
        self.seen: dict[str, list[Window]] = {}
        self.observed: dict[tuple[str, str], datetime] = {}

    def add(
        self, kind: str, profile: str, n_running: Any, n_reserved: Any, until: Any
    ) -> None:
        if kind.startswith("window:"):
            self.seen.setdefault(profile, []).append(
                window_row(kind, n_running, n_reserved, until)
            )
        elif kind.startswith("seen:"):
            self.observed[(profile, kind[len("seen:") :])] = aware(until)
        elif kind == "load":
            if n_running:
                self.running[profile] = n_running
            if n_reserved:
                self.reserved[profile] = n_reserved
        elif kind == "account":
            self.limits[profile] = AccountLimits(
                enabled=bool(n_running & 1),
                max_running=n_reserved,
                login_failed=bool(n_running & 2),
                window_budgets=bool(n_running & 4),
                window_pace=bool(n_running & 8),
                unresponsive_until=aware(until) if until is not None else None,
            )
        else:
            self.cooling[profile] = aware(until)

    def state(self) -> AccountState:
        return AccountState(
            load=AccountLoad(running=self.running, reserved=self.reserved),
            cooling=self.cooling,
            limits=self.limits,
            windows={
                profile: sorted(
                    (
                        replace(w, observed_at=self.observed.get((profile, w.name)))
                        for w in found
                    ),
                    key=lambda w: w.name,
                )
                for profile, found in self.seen.items()
            },
        )
