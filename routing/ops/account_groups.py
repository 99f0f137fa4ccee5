"""What /ops/accounts/ and the overview's account table show of many accounts:
each account's one state, the page's filter by provider and state (its query string), the
accounts grouped by provider with the ones that need nothing folded into one line, and the
windows with the expired ones told apart.

Pure: the rows come from routing.selectors.account_rows, `now` from the view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from domain.windows import Window
from routing.selectors import AccountRow

# An account's state, the first that holds, in this order; the filter's values.
STATES = (
    ("cooling", "cooling down"),
    ("login-failed", "login failed"),
    ("unresponsive", "unresponsive"),
    ("disabled", "disabled"),
    ("at-window", "at a window"),
    ("busy", "running or reserved"),
    ("failing", "failed in 7 d"),
    ("free", "free"),
)
STATE_LABELS = dict(STATES)
NO_PROVIDER = "(no provider known)"


def account_state(row: AccountRow, now: datetime) -> str:
    """One word for where the account stands (a key of STATES)."""
    registered = row.registered
    if row.cooling(now):
        return "cooling"
    if registered is not None and registered.login_failed:
        return "login-failed"
    if registered is not None and registered.unresponsive_at(now):
        return "unresponsive"
    if row.disabled:
        return "disabled"
    if row.window_mark == "at window":
        return "at-window"
    if row.load or row.at_cap:
        return "busy"
    if row.failed_7d or row.rate_limited_7d:
        return "failing"
    return "free"


def needs_a_row(row: AccountRow, now: datetime) -> bool:
    """Whether the account gets its own table row: one with something to show (a state
    other than free, a window mark, steps or usage in the last 7 days). The others, free
    and unused, are listed on one line."""
    return (
        account_state(row, now) != "free"
        or row.window_mark is not None
        or row.steps_7d > 0
        or row.usage_7d is not None
    )


@dataclass
class AccountGroup:
    provider: str
    rows: list[AccountRow] = field(default_factory=list)  # each with its own row
    folded: list[AccountRow] = field(default_factory=list)  # free, on one line
    states: dict[str, int] = field(default_factory=dict)
    first: int = 1  # the page-wide number of its first row (the rows' ids)

    @property
    def size(self) -> int:
        return len(self.rows) + len(self.folded)

    @property
    def summary(self) -> str:
        """`8 accounts: 4 cooling down, 4 free`."""
        parts = [
            f"{self.states[key]} {label}"
            for key, label in STATES
            if self.states.get(key)
        ]
        noun = "account" if self.size == 1 else "accounts"
        return f"{self.size} {noun}: {', '.join(parts)}"


@dataclass(frozen=True)
class AccountFilter:
    provider: str = ""
    state: str = ""
    error: str = ""  # a value the filter refused, in words

    def keeps(self, row: AccountRow, now: datetime) -> bool:
        if self.provider and provider_of(row) != self.provider:
            return False
        return not self.state or account_state(row, now) == self.state

    def query(self, **change: str) -> str:
        """This filter's query string with `change` applied (`?provider=codex`)."""
        values = {"provider": self.provider, "state": self.state, **change}
        return "?" + urlencode({k: v for k, v in values.items() if v})

    @property
    def free_query(self) -> str:
        """The link to the free accounts, each in full."""
        return self.query(state="free")


def provider_of(row: AccountRow) -> str:
    return row.tool or NO_PROVIDER


def account_filter(query: Mapping[str, str]) -> AccountFilter:
    """The filter a query string asks for; an unknown state is refused in words (and the
    page shows every state)."""
    provider = str(query.get("provider") or "").strip()[:200]
    state = str(query.get("state") or "").strip()
    if state and state not in STATE_LABELS:
        known = ", ".join(key for key, _ in STATES)
        return AccountFilter(
            provider=provider,
            error=f"There is no account state {state[:40]!r}: one of {known}.",
        )
    return AccountFilter(provider=provider, state=state)


@dataclass(frozen=True)
class FilterChoice:
    label: str
    count: int
    query: str
    current: bool


def filter_choices(
    rows: Sequence[AccountRow], chosen: AccountFilter, now: datetime
) -> dict[str, list[FilterChoice]]:
    """The filter's links: "all", then each provider and each state with how many
    accounts it holds under the other half of the filter."""
    providers: dict[str, int] = {}
    states: dict[str, int] = {}
    for row in rows:
        provider, state = provider_of(row), account_state(row, now)
        if not chosen.state or state == chosen.state:
            providers[provider] = providers.get(provider, 0) + 1
        if not chosen.provider or provider == chosen.provider:
            states[state] = states.get(state, 0) + 1
    return {
        "providers": [
            FilterChoice(
                "all",
                sum(providers.values()),
                chosen.query(provider=""),
                not chosen.provider,
            ),
            *(
                FilterChoice(
                    name, n, chosen.query(provider=name), name == chosen.provider
                )
                for name, n in sorted(providers.items())
            ),
        ],
        "states": [
            FilterChoice(
                "all", sum(states.values()), chosen.query(state=""), not chosen.state
            ),
            *(
                FilterChoice(
                    label, states[key], chosen.query(state=key), key == chosen.state
                )
                for key, label in STATES
                if states.get(key)
            ),
        ],
    }


def account_groups(
    rows: Sequence[AccountRow], now: datetime, *, fold: bool = True
) -> list[AccountGroup]:
    """`rows` grouped by provider (alphabetical, the unknown last): in each, the accounts
    that need their own row, then (with `fold`) the free ones on one line."""
    groups: dict[str, AccountGroup] = {}
    for row in rows:
        group = groups.setdefault(provider_of(row), AccountGroup(provider_of(row)))
        state = account_state(row, now)
        group.states[state] = group.states.get(state, 0) + 1
        own = not fold or needs_a_row(row, now)
        (group.rows if own else group.folded).append(row)
    ordered = sorted(
        groups.values(), key=lambda g: (g.provider == NO_PROVIDER, g.provider)
    )
    first = 1
    for group in ordered:
        group.first, first = first, first + len(group.rows)
    return ordered


@dataclass(frozen=True)
class WindowRow:
    profile: str
    window: Window
    expired: bool  # its reset has passed: it counts for nothing (docs/windows.md §4)


def window_rows(rows: Sequence[AccountRow], now: datetime) -> list[WindowRow]:
    """Each shown account's windows, each marked expired once its reset has passed."""
    return [
        WindowRow(profile=row.profile, window=w, expired=w.over(now))
        for row in rows
        for w in row.windows
    ]


def accounts_page(
    rows: Sequence[AccountRow], query: Mapping[str, str], now: datetime
) -> dict[str, Any]:
    """The accounts page's context for `rows` (every known account) and its query string:
    the accounts the filter keeps, grouped, their windows, the filter's links."""
    chosen = account_filter(query)
    kept = [row for row in rows if chosen.keeps(row, now)]
    windows = window_rows(kept, now)
    return {
        "accounts": kept,
        "known_accounts": len(rows),
        "account_filter": chosen,
        "filter_choices": filter_choices(rows, chosen, now),
        # A state asked for shows each of its accounts in full.
        "groups": account_groups(kept, now, fold=not chosen.state),
        "window_rows": windows,
        "any_windows": bool(windows),
    }


def overview_accounts(
    rows: Sequence[AccountRow], now: datetime
) -> tuple[list[AccountRow], list[AccountRow]]:
    """The overview's account load: the accounts that need their own row, and the free
    ones it lists on one line."""
    own = [row for row in rows if needs_a_row(row, now)]
    return own, [row for row in rows if not needs_a_row(row, now)]
