"""`GET /metrics`: the ledger in the Prometheus text exposition format (version 0.0.4).

Everything is computed from rows at scrape time (docs/design.md, "counts come from rows"), so a
restarted web process reports the same numbers and several web processes never disagree:
- gauges for live state: active work per route scope with its cap, running and reserved steps
  per account with the per-profile cap, cooldowns, deferred items per reason code, the oldest
  deferred item's age, inbox depth per open state;
- counters summed from drain records (real drains only; dry runs are previews): drains and
  their per-item results per route key, and drain durations as a summary (_sum and _count)
  plus the latest drain's duration.
A scrape runs a fixed number of queries, whatever the size of the ledger. Hand-written (no
prometheus_client): the format is a few lines of text and this keeps the process stateless.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from domain.keys import ROUTE_KEYS
from ledger.lock import lock_state
from ledger.webkit import access
from routing.api.auth import api_auth
from routing.drains.configs import DrainConfig, drain_configs
from routing.models import DrainRecord
from routing.selectors import (
    AccountRow,
    account_rows,
    deferred_by_reason,
    inbox_by_state,
    scope_rows,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DRAIN_RESULTS = ("created", "deduped", "throttled", "skipped", "fatal")

Labels = tuple[tuple[str, str], ...]


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


@dataclass
class Family:
    name: str
    kind: str  # gauge, counter, summary
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)

    def add(self, value: float, suffix: str = "", **labels: str | None) -> None:
        pairs = tuple((k, "" if v is None else str(v)) for k, v in labels.items())
        self.samples.append((self.name + suffix, pairs, value))

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {escape_help(self.help)}"
        yield f"# TYPE {self.name} {self.kind}"
        for name, labels, value in self.samples:
            text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
            yield (
                f"{name}{{{text}}} {format_value(value)}"
                if text
                else (f"{name} {format_value(value)}")
            )


def collect(*, now: datetime) -> list[Family]:
    """Every metric family, from a fixed number of queries (one more on PostgreSQL, where
    the admission lock's holder and waiters are read from pg_locks)."""
    # schedules + latest real drain per scope: 2 queries
    configs = drain_configs(now=now)
    scopes = _scope_families(configs)
    accounts = account_rows(configs, now=now)
    account_families = [
        *_account_load_families(accounts, now),
        _account_registry_family(accounts),
        *_account_usage_families(accounts),
        *_account_window_families(accounts, now),
    ]
    deferred = _deferred_families(now)
    inbox = _inbox_family()
    return [
        *lock_families(),
        *scopes,
        *account_families,
        *deferred,
        inbox,
        *_drain_families(),
    ]


def _scope_families(configs: Sequence[DrainConfig]) -> list[Family]:
    """Active work per route scope, and the scope's --max-active."""
    active = Family(
        "loopsweb_active_work_items",
        "gauge",
        "Work items admitted or running, per route scope (route_scope is empty for rows "
        "written before scopes existed).",
    )
    scope_cap = Family(
        "loopsweb_route_scope_max_active",
        "gauge",
        "--max-active of the route scope: the strictest of its drain schedules and its "
        "latest drain. Absent when no cap is known.",
    )
    for row in scope_rows(configs):
        active.add(row.active, route_scope=row.key)
        if row.cap is not None:
            scope_cap.add(row.cap.limit, route_scope=row.key)
    return [active, scope_cap]


def _account_load_families(
    accounts: Iterable[AccountRow], now: datetime
) -> list[Family]:
    """Per account: running and reserved steps, the per-profile cap, the cooldown left."""
    running = Family(
        "loopsweb_account_running_steps", "gauge", "Step runs running on the account."
    )
    reserved = Family(
        "loopsweb_account_reserved_steps",
        "gauge",
        "Admitted runs not yet started whose next step is on the account.",
    )
    profile_cap = Family(
        "loopsweb_account_max_per_profile",
        "gauge",
        "--max-per-profile that applies to the account (strictest pool naming it, tightened "
        "by the registry's max running). Absent "
        "when no pool routing caps it.",
    )
    cooldown = Family(
        "loopsweb_account_cooldown_seconds",
        "gauge",
        "Seconds until a rate-limited account may take new steps (cooling accounts only).",
    )
    for account in accounts:
        running.add(account.running, account=account.profile)
        reserved.add(account.reserved, account=account.profile)
        if account.cap is not None:
            profile_cap.add(account.cap.limit, account=account.profile)
        if account.cooldown is not None and account.cooling(now):
            remaining = (account.cooldown.until - now).total_seconds()
            cooldown.add(round(remaining, 3), account=account.profile)
    return [running, reserved, profile_cap, cooldown]


def _account_registry_family(accounts: Iterable[AccountRow]) -> Family:
    """The accounts of the account registry, enabled or not."""
    registered = Family(
        "loopsweb_account_registered",
        "gauge",
        "1 for each account in the account registry (enabled 1 or 0, its provider).",
    )
    for account in accounts:
        if account.registered is not None:
            registered.add(
                1,
                account=account.profile,
                provider=account.registered.provider,
                enabled="1" if account.registered.enabled else "0",
            )
    return registered


def _account_usage_families(accounts: Iterable[AccountRow]) -> list[Family]:
    """Per account and window (5h, 7d): the tokens and the cost the agents reported."""
    tokens = Family(
        "loopsweb_account_tokens",
        "gauge",
        "Tokens the agents reported for steps that started in the window (5h, 7d); kind "
        "input (cached included), output, cached.",
    )
    cost = Family(
        "loopsweb_account_cost_usd",
        "gauge",
        "Cost the agents reported (claude) for steps that started in the window.",
    )
    for account in accounts:
        for window, usage in (("5h", account.usage_5h), ("7d", account.usage_7d)):
            if usage is None:
                continue
            tokens.add(
                usage.input_tokens, account=account.profile, window=window, kind="input"
            )
            tokens.add(
                usage.output_tokens,
                account=account.profile,
                window=window,
                kind="output",
            )
            tokens.add(
                usage.cached_tokens,
                account=account.profile,
                window=window,
                kind="cached",
            )
            if usage.cost_usd is not None:
                cost.add(
                    round(usage.cost_usd, 6), account=account.profile, window=window
                )
    return [tokens, cost]


def _account_window_families(
    accounts: Iterable[AccountRow], now: datetime
) -> list[Family]:
    """Per account and rate-limit window not yet reset: its used fraction, its reset."""
    window_used = Family(
        "loopsweb_account_window_used_ratio",
        "gauge",
        "Used fraction (0..1) of the account's rate-limit window (5h, 7d, ...): what its "
        "CLI last reported, or loopsweb's estimate against the account's budget. Absent "
        "when unknown or the window has reset.",
    )
    window_reset = Family(
        "loopsweb_account_window_reset_timestamp_seconds",
        "gauge",
        "When the account's rate-limit window resets (Unix time). Absent when unknown.",
    )
    for account in accounts:
        for seen in account.windows:
            if seen.over(now):
                continue
            if seen.used is not None:
                window_used.add(
                    round(seen.used, 6), account=account.profile, window=seen.name
                )
            if seen.resets_at is not None:
                window_reset.add(
                    int(seen.resets_at.timestamp()),
                    account=account.profile,
                    window=seen.name,
                )
    return [window_used, window_reset]


def _deferred_families(now: datetime) -> list[Family]:
    """Deferred work items per reason code, and the oldest one's age."""
    deferred = Family(
        "loopsweb_deferred_work_items",
        "gauge",
        "Deferred work items per reason code.",
    )
    oldest = Family(
        "loopsweb_oldest_deferred_age_seconds",
        "gauge",
        "Age of the oldest deferred work item (0 when nothing is deferred).",
    )
    oldest_at: datetime | None = None
    for reason_code, (n, oldest_of_reason) in deferred_by_reason().items():
        deferred.add(n, reason_code=reason_code)
        if oldest_of_reason is not None and (
            oldest_at is None or oldest_of_reason < oldest_at
        ):
            oldest_at = oldest_of_reason
    oldest.add(
        round(max(0.0, (now - oldest_at).total_seconds()), 3) if oldest_at else 0
    )
    return [deferred, oldest]


def _inbox_family() -> Family:
    """Inbox depth: waiting to be routed (pending, deferred) or failed and needing a look."""
    inbox = Family(
        "loopsweb_inbox_events",
        "gauge",
        "Inbox events waiting (pending, deferred) or failed, per state.",
    )
    for state, depth in inbox_by_state().items():
        inbox.add(depth["n"], state=state)
    return inbox


def lock_families() -> list[Family]:
    """The admission lock as PostgreSQL sees it now (ledger.lock.lock_state; none on SQLite)."""
    state = lock_state()
    if state is None:
        return []
    waiters = Family(
        "loopsweb_admission_lock_waiters",
        "gauge",
        "Transactions waiting for the admission lock now.",
    )
    waiters.add(state.waiters)
    wait = Family(
        "loopsweb_admission_lock_wait_seconds",
        "gauge",
        "How long the longest current wait for the admission lock has lasted.",
    )
    wait.add(round(state.longest_wait_seconds, 3))
    held = Family(
        "loopsweb_admission_lock_held_seconds",
        "gauge",
        "How long the admission lock's holder has held it, by the holder's host; idle is "
        "true while the holder sends nothing (LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS ends it). "
        "Absent while nobody holds it.",
    )
    if state.held_seconds or state.holder:
        held.add(
            round(state.held_seconds, 3),
            host=state.holder or "",
            idle="true" if state.holder_idle else "false",
        )
    return [waiters, wait, held]


def _drain_families() -> list[Family]:
    # Counter families carry their _total suffix in the 0.0.4 text format.
    drains = Family(
        "loopsweb_drains_total",
        "counter",
        "Drains run (dry runs excluded), per route key.",
    )
    items = Family(
        "loopsweb_drain_items_total",
        "counter",
        "Items considered by drains, per route key and result.",
    )
    duration = Family(
        "loopsweb_drain_duration_seconds", "summary", "Drain durations, per route key."
    )
    last = Family(
        "loopsweb_drain_last_duration_seconds",
        "gauge",
        "Duration of the latest drain, per route key.",
    )
    last_time = Family(
        "loopsweb_drain_last_timestamp_seconds",
        "gauge",
        "Start of the latest drain (Unix time), per route key.",
    )
    real = DrainRecord.objects.filter(dry_run=False)
    totals: dict[str, dict[str, int]] = {}
    for row in (
        real.values("kind")
        .annotate(
            n=Count("id"),
            ms=Sum("duration_ms"),
            **{result: Sum(result) for result in DRAIN_RESULTS},
        )
        .order_by("kind")
    ):
        totals[row["kind"]] = row
    for kind in sorted(set(ROUTE_KEYS) | set(totals)):
        row = totals.get(kind, {})
        drains.add(row.get("n", 0), kind=kind)
        for result in DRAIN_RESULTS:
            items.add(row.get(result) or 0, kind=kind, result=result)
        duration.add((row.get("ms") or 0) / 1000, "_sum", kind=kind)
        duration.add(row.get("n", 0), "_count", kind=kind)
    # The latest drain per route key: one short index scan each (idx_drains_started); route
    # keys are a fixed pair, so the query count stays fixed.
    for kind in ROUTE_KEYS:
        latest = (
            real.filter(kind=kind)
            .order_by("-started_at")
            .only("started_at", "duration_ms")
            .first()
        )
        if latest is not None:
            last.add((latest.duration_ms or 0) / 1000, kind=kind)
            last_time.add(round(latest.started_at.timestamp(), 3), kind=kind)
    return [drains, items, duration, last, last_time]


def render(families: Iterable[Family]) -> str:
    lines: list[str] = []
    for family in families:
        lines.extend(family.render())
    return "\n".join(lines) + "\n"


@api_auth("metrics", perms=(access.ACCOUNTS, access.DRAINS))
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(render(collect(now=timezone.now())), content_type=CONTENT_TYPE)
