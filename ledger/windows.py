"""The window ledger: recording what the agent CLIs say of each account's rate-limit windows,
and reading the windows admission decides on (docs/windows.md).

Rules:
1. `windows_record` writes one `AccountWindow` row per observation (autocommit, no lock: an
   observation changes no count) and prunes: per (account, window) only the newest
   `KEEP_PER_WINDOW` rows stay, and rows older than LOOPSWEB_WINDOW_KEEP_DAYS are removed.
   What a step printed is bounded (the agent writes its CLI's output): a reset lies at most
   the window's own length after the observation (a week for a name without a length), and
   an account keeps at most MAX_WINDOWS_PER_ACCOUNT window names (a new name past that is
   not recorded).
2. `latest_windows` is the newest observation per (account, window), for the named accounts
   (or all), seen within LOOPSWEB_WINDOW_KEEP_DAYS.
3. The estimate: an account with window budgets (`account add/edit --window 5h=TOKENS`) gets,
   for each budget window that no provider observation still covers (none, or its reset has
   passed), the tokens (input + output) its step runs finished within the window's length
   before now, divided by the budget; it resets when the oldest of those steps leaves the
   window. Its source says `loopsweb estimate` with the tokens and the cost; its spend is
   the most one of the latest three of those steps spent (domain/windows.py, "token budget").
4. `window_state` = the provider observations plus the estimates: what admission, failover,
   /ops/, /metrics and the API read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from domain import reasons
from domain.windows import (
    DEFAULT_MAX_WINDOW_USED,
    REJECTED,
    WINDOWS_OFF,
    MaxWindowUsed,
    Observation,
    Window,
    WindowFilter,
    budget_spend,
    step_spend,
    window_filter,
)
from ledger.account_state import window_keep_days
from ledger.claims import UNCONFIRMED_LONGEST, UNCONFIRMED_SOURCE, task_runs
from ledger.models import Account, AccountWindow, WorkflowRun, WorkflowStepRun
from ledger.selectors import AccountState

KEEP_PER_WINDOW = 10
MAX_WINDOWS_PER_ACCOUNT = 16
LONGEST_WINDOW = timedelta(days=7)  # the longest window a provider keeps (a week)
SOURCE_ESTIMATE = "loopsweb estimate"
_DURATION = re.compile(r"^([1-9][0-9]{0,4})([mhd])$")
_UNIT = {"m": 60, "h": 3600, "d": 86400}
BUDGET_INVALID = (
    "--window must be WINDOW=TOKENS with WINDOW like 5h, 7d or 90m and TOKENS a whole "
    "number > 0, not {value!r}"
)


def window_seconds(name: str) -> int | None:
    """The length of a window named `5h`, `7d`, `90m` (None for any other name)."""
    found = _DURATION.match(name)
    return int(found.group(1)) * _UNIT[found.group(2)] if found else None


def parse_budgets(pairs: Iterable[str]) -> dict[str, int]:
    """`["5h=2000000", "7d=9000000"]` → {"5h": 2000000, "7d": 9000000}; ValueError on bad
    input (the message names the bad pair)."""
    out: dict[str, int] = {}
    for pair in pairs:
        name, sep, tokens = str(pair).partition("=")
        name = name.strip()
        if not sep or window_seconds(name) is None or not tokens.strip().isdigit():
            raise ValueError(BUDGET_INVALID.format(value=pair))
        value = int(tokens.strip())
        if not 0 < value <= 10**15:
            raise ValueError(BUDGET_INVALID.format(value=pair))
        out[name] = value
    return out


def windows_record(
    *,
    account: str,
    provider: str | None,
    windows: Sequence[Window],
    step_run_id: str | None = None,
    now: datetime | None = None,
) -> int:
    """Record `windows` of `account` (module docstring, `windows_record`); returns how many
    rows were written."""
    if not account or not windows:
        return 0
    now = now or timezone.now()
    windows = _bounded(account, windows, now)
    if not windows:
        return 0
    AccountWindow.objects.bulk_create(
        [
            AccountWindow(
                account_profile=account,
                provider=(provider or "")[:20],
                window=w.name[:60],
                used=w.used,
                status=w.status,
                resets_at=w.resets_at,
                observed_at=w.observed_at or now,
                source=w.source[:200],
                step_run_id=step_run_id,
            )
            for w in windows
        ]
    )
    for name in {w.name[:60] for w in windows}:
        stale = list(
            AccountWindow.objects.filter(account_profile=account, window=name)
            .order_by("-observed_at")
            .values_list("id", flat=True)[KEEP_PER_WINDOW:]
        )
        if stale:
            AccountWindow.objects.filter(id__in=stale).delete()
    AccountWindow.objects.filter(
        observed_at__lt=now - timedelta(days=window_keep_days())
    ).delete()
    return len(windows)


def windows_claimed(
    *,
    account: str,
    provider: str | None,
    windows: Sequence[Window],
    step_run_id: str | None,
    now: datetime | None = None,
) -> tuple[int, list[Window]]:
    """What a step's CLI reported (ledger.claims): `windows_record` after the task's bound
    on exhausted windows (rejected, or 100 % used; a 429 the runner saw is one too). One
    of a second account of the task is not recorded; one that would stand longer than
    UNCONFIRMED_LONGEST is recorded until then, its source saying unconfirmed. A lower
    reading of a window the ledger holds exhausted is left out (`_no_refill`). Returns the
    rows written and the windows as claimed, to confirm."""
    now = now or timezone.now()
    if step_run_id:
        windows = _no_refill(account, windows, now)
    spent = [w for w in windows if w.exhausted(now, max_used=1.0)]
    if not spent or not step_run_id:
        return windows_record(
            account=account,
            provider=provider,
            windows=windows,
            step_run_id=step_run_id,
            now=now,
        ), []
    kept = [w for w in windows if w not in spent]
    confirm: list[Window] = []
    if not _task_spent_elsewhere(account, step_run_id):
        longest = now + UNCONFIRMED_LONGEST
        for window in spent:
            if window.resets_at is not None and window.resets_at <= longest:
                kept.append(window)
                continue
            claimed = window.resets_at or now + _length(window.name)
            confirm.append(replace(window, resets_at=claimed))
            source = UNCONFIRMED_SOURCE.format(
                claimed=claimed.isoformat(), source=window.source
            )
            kept.append(replace(window, resets_at=longest, source=source))
    written = windows_record(
        account=account,
        provider=provider,
        windows=kept,
        step_run_id=step_run_id,
        now=now,
    )
    return written, confirm


def _no_refill(account: str, windows: Sequence[Window], now: datetime) -> list[Window]:
    """A step's report never refills a window the ledger holds exhausted until a reset that
    has not passed: such a window's lower reading is left out (only the provider's own
    answer to loopsweb's request, `account check` or `account clear` ends it early)."""
    held = {
        w.name
        for w in latest_windows([account], now=now).get(account, [])
        if w.exhausted(now, max_used=1.0)
    }
    if not held:
        return list(windows)
    return [w for w in windows if w.name not in held or w.exhausted(now, max_used=1.0)]


def _task_spent_elsewhere(account: str, step_run_id: str) -> bool:
    """Whether the step's task (ledger/claims.py, "the bound") recorded an exhausted window
    of another account."""
    run = WorkflowRun.objects.filter(step_runs=step_run_id).first()
    if run is None:
        return False
    steps = WorkflowStepRun.objects.filter(workflow_run_id__in=task_runs(run))
    return (
        AccountWindow.objects.filter(
            Q(status=REJECTED) | Q(used__gte=1.0),
            step_run_id__in=steps.values("id"),
        )
        .exclude(account_profile=account)
        .exists()
    )


def _length(name: str) -> timedelta:
    """A window's length (the longest a provider keeps for a name without one)."""
    seconds = window_seconds(name)
    if seconds and seconds <= LONGEST_WINDOW.total_seconds():
        return timedelta(seconds=seconds)
    return LONGEST_WINDOW


def _bounded(account: str, windows: Sequence[Window], now: datetime) -> list[Window]:
    """The bounds on what a step printed (module docstring, `windows_record`)."""
    known = set(
        AccountWindow.objects.filter(account_profile=account)
        .values_list("window", flat=True)
        .distinct()
    )
    kept: list[Window] = []
    for window in windows:
        name = window.name[:60]
        if name not in known and len(known) >= MAX_WINDOWS_PER_ACCOUNT:
            continue
        known.add(name)
        latest = (window.observed_at or now) + _length(name)
        if window.resets_at is not None and window.resets_at > latest:
            window = replace(window, resets_at=latest)
        kept.append(window)
    return kept


def _window(row: AccountWindow) -> Window:
    return Window(
        name=row.window,
        used=row.used,
        status=row.status,
        resets_at=row.resets_at,
        source=row.source,
        observed_at=row.observed_at,
    )


def latest_windows(
    accounts: Iterable[str] | None = None, *, now: datetime | None = None
) -> dict[str, list[Window]]:
    """Account → its windows (the newest observation of each), by window name (module
    docstring, `latest_windows`)."""
    now = now or timezone.now()
    rows = AccountWindow.objects.filter(
        observed_at__gte=now - timedelta(days=window_keep_days())
    )
    if accounts is not None:
        names = sorted({str(a).strip() for a in accounts})
        if not names:
            return {}
        rows = rows.filter(account_profile__in=names)
    latest: dict[tuple[str, str], AccountWindow] = {}
    for row in rows.order_by("observed_at", "id"):
        latest[(row.account_profile, row.window)] = row
    out: dict[str, list[Window]] = {}
    for (account, _name), row in sorted(latest.items()):
        out.setdefault(account, []).append(_window(row))
    return out


def _estimate(account: str, name: str, budget: int, now: datetime) -> Window | None:
    length = window_seconds(name)
    if length is None:
        return None
    since = now - timedelta(seconds=length)
    cost = 0.0
    # Each step's tokens, oldest first (its spend: domain/windows.py, "token budget").
    steps: list[int] = []
    oldest: datetime | None = None
    for inp, out, usd, finished in (
        WorkflowStepRun.objects.filter(
            Q(usage_input_tokens__isnull=False) | Q(usage_output_tokens__isnull=False),
            account_profile=account,
            finished_at__gte=since,
        )
        .order_by("finished_at", "id")
        .values_list(
            "usage_input_tokens", "usage_output_tokens", "usage_cost_usd", "finished_at"
        )
    ):
        steps.append((inp or 0) + (out or 0))
        cost += usd or 0.0
        if finished is not None and (oldest is None or finished < oldest):
            oldest = finished
    tokens = sum(steps)
    return Window(
        name=name,
        used=min(tokens / budget, 1.0),
        resets_at=oldest + timedelta(seconds=length) if oldest else None,
        source=f"{SOURCE_ESTIMATE}: {tokens} of {budget} tokens, ${cost:.2f}",
        observed_at=now,
        spend=budget_spend(steps, budget),
        estimated=True,
    )


def with_estimates(
    observed: Mapping[str, Sequence[Window]],
    budgets: Mapping[str, Mapping[str, Any] | None],
    now: datetime,
) -> dict[str, list[Window]]:
    """The estimate (module docstring) over `observed` (account -> its newest windows): each
    budget window that no observation still covers gets the estimate (one query per such
    window)."""
    out = {name: list(seen) for name, seen in observed.items()}
    for account, budget_map in sorted(budgets.items()):
        if not isinstance(budget_map, Mapping):
            continue
        seen = {w.name: w for w in out.get(account, [])}
        for name, budget in sorted(budget_map.items()):
            current = seen.get(name)
            if current is not None and not current.over(now):
                continue  # the provider's word is fresher
            if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
                continue
            estimate = _estimate(account, name, budget, now)
            if estimate is not None:
                kept = [w for w in out.get(account, []) if w.name != name]
                out[account] = [*kept, estimate]
    return out


def window_state(
    accounts: Iterable[str] | None = None, *, now: datetime | None = None
) -> dict[str, list[Window]]:
    """The observed windows plus the estimates of the windows nothing observes (module
    docstring, `window_state`)."""
    now = now or timezone.now()
    names = None if accounts is None else sorted({str(a).strip() for a in accounts})
    budgets = Account.objects.exclude(window_budgets__isnull=True)
    if names is not None:
        budgets = budgets.filter(name__in=names)
    return with_spend(
        with_estimates(
            latest_windows(names, now=now),
            dict(budgets.values_list("name", "window_budgets")),
            now,
        ),
        now,
    )


def state_windows(
    state: AccountState, budgets: Mapping[str, Mapping[str, Any] | None], now: datetime
) -> dict[str, list[Window]]:
    """The windows of an `account_state(windows=True)` read plus the estimates of the
    accounts in `budgets` (no statement unless one of them has a budget), with each
    window's spend estimate (`with_spend`: one statement when a window is known)."""
    if not any(budgets.values()):
        return with_spend(state.windows, now)
    return with_spend(with_estimates(state.windows, budgets, now), now)


WAIT_WINDOW_EXHAUSTED = "account {profile} at its window budget ({detail})"


def step_max_window_used(spec: dict[str, Any]) -> MaxWindowUsed:
    """The --max-window-used a step was routed with (`routing.maxWindowUsed`: a fraction
    or `off`), else 0.9."""
    routing = spec.get("routing") if isinstance(spec, dict) else None
    value = routing.get("maxWindowUsed") if isinstance(routing, dict) else None
    if value == WINDOWS_OFF:
        return WINDOWS_OFF
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value <= 1
    ):
        return float(value)
    return DEFAULT_MAX_WINDOW_USED


def pool_windows(
    members: Sequence[str],
    spec: dict[str, Any],
    now: datetime,
    running: Mapping[str, int] | None = None,
) -> WindowFilter:
    """The window rule (domain.windows) over `members` for a step about to start
    (`running`: the steps each member carries now, for the prediction)."""
    return window_filter(
        list(members),
        window_state(members, now=now),
        now,
        step_max_window_used(spec),
        running=running,
    )


def window_refusal(
    profile: str, spec: dict[str, Any], now: datetime, running: int = 0
) -> tuple[str, str, datetime | None] | None:
    """(window_exhausted, why, when it frees) for a step whose account's window is spent
    or predicted to run out with `running` other steps on it, else None: a step start
    refuses it (and fails over when it can)."""
    spent = pool_windows([profile], spec, now, {profile: running})
    if profile not in spent.exhausted:
        return None
    reason = WAIT_WINDOW_EXHAUSTED.format(profile=profile, detail=spent.detail[profile])
    return reasons.WINDOW_EXHAUSTED, reason, spent.exhausted[profile]


def budgets_of(account: str) -> dict[str, int] | None:
    """The window budgets of one registered account (None: none)."""
    value = (
        Account.objects.filter(pk=account)
        .values_list("window_budgets", flat=True)
        .first()
    )
    return value if isinstance(value, dict) else None


# --- what one step spends of each window (domain/windows.py, "spend estimate") -------------


def with_spend(
    windows: Mapping[str, Sequence[Window]], now: datetime
) -> dict[str, list[Window]]:
    """`windows` (account -> its windows) with each window's spend estimate set; a window
    that knows its spend already (loopsweb's estimate from a token budget, domain/windows.py,
    "token budget") keeps it."""
    out = {name: list(seen) for name, seen in windows.items()}
    accounts = sorted(name for name, seen in out.items() if seen)
    if not accounts:
        return out
    seen_rows: dict[tuple[str, str], list[Observation]] = {}
    for account, window, run, used, resets, observed in (
        AccountWindow.objects.filter(
            account_profile__in=accounts,
            step_run_id__isnull=False,
            used__isnull=False,
            observed_at__gte=now - timedelta(days=window_keep_days()),
        )
        .order_by("observed_at", "id")
        .values_list(
            "account_profile",
            "window",
            "step_run_id",
            "used",
            "resets_at",
            "observed_at",
        )
    ):
        seen_rows.setdefault((account, window), []).append(
            Observation(step_run=run, used=used, resets_at=resets, observed_at=observed)
        )
    for account in accounts:
        out[account] = [
            w
            if w.spend is not None
            else replace(w, spend=step_spend(seen_rows.get((account, w.name), ())))
            for w in out[account]
        ]
    return out
