"""What one step spends of each account window (domain.windows rule 8), read from the
window ledger: the observations step runs recorded (`account_windows.step_run_id`), at most
`ledger.windows.KEEP_PER_WINDOW` per window. One statement, and none when no window is
known (a pool with no windows reads exactly what it read before)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from domain.windows import Observation, Window, step_spend
from ledger.models import AccountWindow
from ledger.window_rows import window_keep_days


def with_spend(
    windows: Mapping[str, Sequence[Window]], now: datetime
) -> dict[str, list[Window]]:
    """`windows` (account -> its windows) with each window's spend estimate set; a window
    that knows its spend already (loopsweb's estimate from a token budget, domain.windows
    rule 10) keeps it."""
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
