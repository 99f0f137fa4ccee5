"""Rate-limit windows of an account and the admission rule on them (docs/windows.md).

Contract:
1. **Observation.** A `Window` is the latest observation of one window of one account: its
   name (`5h`, `7d`, or the provider's own), the used fraction (0..1, None when the provider
   did not say), the provider's status (`allowed`, `allowed_warning`, `rejected`, None),
   when it resets (None: unknown), where it came from, when it was seen, and `spend` (see
   "spend estimate").
2. **Over.** A window whose reset is at or before `now` is over: it counts for nothing.
3. **Exhausted window.** A window is exhausted when it is not over and its status is
   `rejected`, or its used fraction is >= `max_used` (the route's --max-window-used, default
   0.9), or it is predicted to run out before the step would finish: with `spend` the
   window's estimate of what one step spends of it (None: unknown) and `running` the steps
   the account carries now (running + reserved, the load the least-loaded rule uses), used +
   (running + 1) x spend > 1.0: one step's expected spend is kept in reserve for each step
   the account carries and for the one to start. With no spend known (or no used fraction)
   only the first two hold, so a pool with no windows, or with windows but no spend known,
   is decided as before; except loopsweb's own estimate from a token budget (see "token
   budget"), whose unknown spend holds the account to one step at a time (running >= 1: runs
   out).
4. **Exhausted account.** An account is exhausted when any of its windows is; it is free
   again at the LATEST reset of its exhausted windows (None when one of them has no known
   reset), a predicted one included.
5. **Headroom** of an account = min over its windows (not over, used known) of 1 - used; an
   account with no such window has headroom 1.0 (nothing known spent), so a pool where no
   window is known is decided exactly as before.
6. **Filter.** `window_filter` keeps the members (in their order) that are not exhausted,
   and names the exhausted ones with the time each frees; `earliest_reset` is the first of
   those times.
7. **Pacing** (an account with `window_pace`): a window of known length (`5h`, `7d`, `90m`),
   used fraction and reset may be used only as far as its elapsed share: with L its length
   and the window started at reset - L, the account is paced while used > elapsed / L, until
   reset - L * (1 - used) (when the elapsed share catches up). Paced members are removed
   after the exhausted ones; a pool left with none defers with `window_paced`.
8. **Spend estimate.** A window's spend estimate (`step_spend`): from its observations
   recorded by step runs, oldest first, each step run's last one; the increase of the used
   fraction from one step run's last observation to the next one's, when the next was seen
   before the earlier's reset (one reset period) and the used fraction did not fall, is what
   that step spent. The estimate is the MAX of the latest `SPEND_SAMPLES` (3) such increases
   (the max: a step that spends more than the estimate is what makes the 429), None when
   there is none.
9. **Windows off.** With `max_used` `off` (WINDOWS_OFF, the route's `--max-window-used off`)
   the rule is skipped: `window_filter` keeps every member, exhausted, paced and headroom
   empty, so the pool is decided exactly as with no window known.
10. **Token budget.** loopsweb's estimate from a token budget (docs/windows.md §3:
   `estimated`, its used fraction the tokens of the account's steps that finished within the
   window over the budget) knows its spend from one finished step, no second observation
   needed (`budget_spend`): the MAX of the latest `SPEND_SAMPLES` finished steps' tokens
   over the budget. Before any step finished within the window the spend is unknown, and the
   account takes one step at a time (see "exhausted window"), so the budget is passed by at
   most that step's spend.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from domain.errors import ValidationError

DEFAULT_MAX_WINDOW_USED = 0.9
# `--max-window-used off` ("windows off", module docstring): the route ignores the windows
# (no threshold, no prediction, no pacing): the least-loaded rule as before windows existed.
WINDOWS_OFF: Literal["off"] = "off"
MaxWindowUsed = float | Literal["off"]
REJECTED = "rejected"
STATUSES = ("allowed", "allowed_warning", "rejected")

WINDOW_EXHAUSTED_REASON = "all {n} pool members at their window budget ({detail})"
WINDOW_PACED_REASON = "all {n} pool members ahead of their window pace ({detail})"
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400}
SPEND_SAMPLES = 3


@dataclass(frozen=True)
class Observation:
    """One recorded observation of a window, as "spend estimate" (module docstring) reads
    it."""

    step_run: str | None
    used: float | None
    resets_at: datetime | None
    observed_at: datetime


def step_spend(observations: Sequence[Observation]) -> float | None:
    """What one step spends of a window, from its observations (oldest first): "spend
    estimate", module docstring."""
    last: dict[str, Observation] = {}  # each step run's last observation
    for seen in observations:
        if seen.step_run is not None and seen.used is not None:
            last[seen.step_run] = seen
    runs = sorted(last.values(), key=lambda o: o.observed_at)
    deltas: list[float] = []
    for before, after in zip(runs, runs[1:], strict=False):
        delta = (after.used or 0.0) - (before.used or 0.0)
        if before.resets_at is not None and after.observed_at < before.resets_at:
            if delta >= 0:
                deltas.append(delta)
    recent = deltas[-SPEND_SAMPLES:]
    return max(recent) if recent else None


def budget_spend(step_tokens: Sequence[int], budget: int) -> float | None:
    """What one step spends of a token budget ("token budget", module docstring), from the
    tokens (input + output) of the steps that finished within the window, oldest first; None
    before any did."""
    recent = [max(tokens, 0) for tokens in step_tokens][-SPEND_SAMPLES:]
    if budget <= 0 or not recent:
        return None
    return max(recent) / budget


@dataclass(frozen=True)
class Window:
    name: str
    used: float | None = None
    status: str | None = None
    resets_at: datetime | None = None
    source: str = ""
    observed_at: datetime | None = None
    # What one step spends of this window (0..1; None: unknown): ledger.windows.with_spend.
    spend: float | None = None
    # loopsweb's estimate from a token budget ("token budget", module docstring), not a
    # provider's observation.
    estimated: bool = False

    def over(self, now: datetime) -> bool:
        return self.resets_at is not None and self.resets_at <= now

    def runs_out(self, running: int) -> bool:
        """The prediction of "exhausted window" (module docstring): `running` steps and
        this one would pass 100 % (an estimate whose spend is unknown: a second step at
        once, "token budget")."""
        if self.used is None:
            return False
        if self.spend is None:
            return self.estimated and running > 0
        if self.spend <= 0:
            return False
        return self.used + (max(running, 0) + 1) * self.spend > 1.0

    def exhausted(self, now: datetime, max_used: float, running: int = 0) -> bool:
        if self.over(now):
            return False
        if self.status == REJECTED:
            return True
        if self.used is not None and self.used >= max_used:
            return True
        return self.runs_out(running)

    def label(self) -> str:
        """`5h 95% until 2026-12-04T20:00:00Z` (what a deferral reason says; with a spend
        estimate `5h 64% (32%/step) until …`; loopsweb's estimate before its spend is
        known `5h 10% (spend unknown: one step at a time) until …`)."""
        parts = [self.name]
        if self.used is not None:
            parts.append(f"{self.used * 100:.0f}%")
        if self.spend is not None:
            parts.append(f"({self.spend * 100:.0f}%/step)")
        elif self.estimated:
            parts.append("(spend unknown: one step at a time)")
        if self.status:
            parts.append(self.status)
        if self.resets_at is not None:
            parts.append(f"until {iso(self.resets_at)}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.name,
            "used": self.used,
            "status": self.status,
            "resetsAt": iso(self.resets_at) if self.resets_at else None,
            "source": self.source,
            "observedAt": iso(self.observed_at) if self.observed_at else None,
            "spend": self.spend,
        }


def length_seconds(name: str) -> int | None:
    """The length of a window named like `5h`, `7d`, `90m` (None for other names)."""
    unit = _UNIT_SECONDS.get(name[-1:]) if name else None
    digits = name[:-1]
    if unit is None or not digits.isdigit() or digits.startswith("0"):
        return None
    return int(digits) * unit


def paced_until(window: Window, now: datetime) -> datetime | None:
    """When the window's pace lets the account start again (None: not paced): "pacing",
    module docstring."""
    length = length_seconds(window.name)
    if (
        length is None
        or window.used is None
        or window.resets_at is None
        or window.over(now)
    ):
        return None
    frees = window.resets_at - timedelta(seconds=length * (1.0 - window.used))
    return frees if frees > now else None


def iso(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def clamp_fraction(value: Any) -> float | None:
    """A used fraction from a number (bool and non-numbers: None), clamped to 0..1."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value:  # NaN
        return None
    return min(max(float(value), 0.0), 1.0)


def headroom(windows: Iterable[Window], now: datetime) -> float:
    """The account's headroom ("headroom", module docstring)."""
    rooms = [1.0 - w.used for w in windows if w.used is not None and not w.over(now)]
    return min(rooms) if rooms else 1.0


def frees_at(
    windows: Iterable[Window], now: datetime, max_used: float, running: int = 0
) -> tuple[bool, datetime | None]:
    """(exhausted, when it frees) of one account carrying `running` steps ("exhausted
    window", "exhausted account")."""
    spent = [w for w in windows if w.exhausted(now, max_used, running)]
    if not spent:
        return False, None
    if any(w.resets_at is None for w in spent):
        return True, None
    return True, max(w.resets_at for w in spent if w.resets_at is not None)


@dataclass(frozen=True)
class WindowFilter:
    kept: list[str]
    exhausted: dict[str, datetime | None] = field(default_factory=dict)
    headroom: dict[str, float] = field(default_factory=dict)
    detail: dict[str, str] = field(default_factory=dict)
    # "Pacing": members ahead of their pace, with when each may start again.
    paced: dict[str, datetime] = field(default_factory=dict)

    def paced_reason(self, members: Sequence[str]) -> str:
        detail = "; ".join(
            f"{name.strip()}: until {iso(self.paced[name])}"
            for name in members
            if name in self.paced
        )
        text = WINDOW_PACED_REASON.format(n=len(members), detail=detail)
        return f"{text} until {iso(min(self.paced.values()))}" if self.paced else text

    @property
    def earliest_reset(self) -> datetime | None:
        known = [t for t in self.exhausted.values() if t is not None]
        return min(known) if known else None

    def reason(self, members: Sequence[str]) -> str:
        detail = "; ".join(
            f"{name.strip()}: {self.detail[name]}"
            for name in members
            if name in self.detail
        )
        text = WINDOW_EXHAUSTED_REASON.format(n=len(members), detail=detail)
        first = self.earliest_reset
        return f"{text} until {iso(first)}" if first else text


def window_filter(
    members: Sequence[str],
    windows: Mapping[str, Sequence[Window]],
    now: datetime,
    max_used: MaxWindowUsed = DEFAULT_MAX_WINDOW_USED,
    paced: Collection[str] = (),
    running: Mapping[str, int] | None = None,
) -> WindowFilter:
    """The members that may take a step now, and why the others may not ("filter" and
    "pacing", module docstring; `paced`: the accounts whose windows are paced; `running`:
    account -> the steps it carries now, running + reserved, for the prediction of
    "exhausted window"; absent: 0; `max_used` off: "windows off")."""
    if isinstance(max_used, str):  # WINDOWS_OFF: the windows are not looked at
        return WindowFilter(kept=list(members))
    loads = running or {}
    kept: list[str] = []
    exhausted: dict[str, datetime | None] = {}
    rooms: dict[str, float] = {}
    detail: dict[str, str] = {}
    ahead: dict[str, datetime] = {}
    for member in members:
        seen = windows.get(member.strip(), ())
        load = loads.get(member.strip(), 0)
        spent, until = frees_at(seen, now, max_used, load)
        if spent:
            exhausted[member] = until
            detail[member] = ", ".join(
                w.label() for w in seen if w.exhausted(now, max_used, load)
            )
            continue
        if member.strip() in paced:
            frees = [t for w in seen if (t := paced_until(w, now)) is not None]
            if frees:
                ahead[member] = max(frees)
                continue
        kept.append(member)
        if seen:
            rooms[member] = headroom(seen, now)
    return WindowFilter(
        kept=kept, exhausted=exhausted, headroom=rooms, detail=detail, paced=ahead
    )


MAX_WINDOW_USED_INVALID = (
    "--max-window-used must be a fraction above 0 and at most 1 (0.9: defer an account "
    "once 90% of a window is used) or off (ignore the windows), not {value!r}"
)


def parse_max_window_used(value: Any) -> MaxWindowUsed | None:
    """The route option --max-window-used: None (the default, 0.9), a fraction in (0, 1],
    or `off` (WINDOWS_OFF: "windows off", module docstring)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == WINDOWS_OFF:
        return WINDOWS_OFF
    number: float | None = None
    if isinstance(value, str) and value.strip():
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    if number is None or number != number or not 0 < number <= 1:
        raise ValidationError(MAX_WINDOW_USED_INVALID.format(value=value))
    return number
