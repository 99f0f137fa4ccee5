"""Account cooldowns after a provider rate limit: the latest deadline wins; the backoff
grows with repeated reports (ledger.ratelimit). And the other way an account stops taking
work by itself: a refused login (`account_login_failed_record`), which lasts until someone
clears it (`account_login_clear`: `account check` finding the login works, `account
enable`), because no wait makes a revoked key good again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from domain.windows import REJECTED, Window
from ledger.lock import admission_lock
from ledger.models import (
    Account,
    AccountCooldown,
    AccountWindow,
    WorkflowStepRun,
)
from ledger.ratelimit import cooldown_backoff
from ledger.services.common import LedgerError, clean_text, now_or_default
from ledger.windows import latest_windows, windows_record

# The window a 429 seen by the runner is recorded as, and its source.
RATE_LIMIT_WINDOW = "rate_limit"
SOURCE_RATE_LIMIT = "429 seen by the runner"

# --- account cooldowns ------------------------------------------------------------------------


def account_cooldown_record(
    *,
    profile: str,
    tool: str | None,
    until: datetime | None,
    reason: str,
    step_run: WorkflowStepRun | None = None,
    now: datetime | None = None,
) -> AccountCooldown:
    """Record that `profile` reported a provider rate limit; it cools until the deadline.

    1. One row per account profile (upsert), under the admission lock: cooling changes what
       admission and step starts decide, so it is serialised with them.
    2. `reports` counts the reports of the current episode: +1 while the account is cooling
       or freed less than LOOPSWEB_COOLDOWN_CAP_SECONDS ago, else it starts again at 1 (so
       yesterday's limits do not lengthen today's backoff).
    3. Deadline: `until` when the provider named one, else exponential backoff
       (base × 2^(reports−1), capped). The row keeps the LATEST deadline of all overlapping
       reports; reason, tool and step follow the report that set the kept deadline.
    """
    now = now_or_default(now)
    cap = float(settings.LOOPSWEB_COOLDOWN_CAP_SECONDS)
    with transaction.atomic():
        admission_lock()
        row = (
            AccountCooldown.objects.select_for_update(no_key=True)
            .filter(pk=profile)
            .first()
        )
        in_episode = row is not None and row.until > now - timedelta(seconds=cap)
        reports = row.reports + 1 if row is not None and in_episode else 1
        deadline = until
        if deadline is None:
            deadline = now + cooldown_backoff(
                reports=reports,
                base_seconds=float(settings.LOOPSWEB_COOLDOWN_BASE_SECONDS),
                cap_seconds=cap,
            )
        if row is None:
            row = AccountCooldown(account_profile=profile)
        if row.until is None or not in_episode or deadline >= row.until:
            row.until = deadline
            row.reason = clean_text(reason)
            row.account_tool = tool
            row.step_run = step_run
        row.reports = reports
        row.save()
        if step_run is not None:
            # The 429 the runner saw, as a window observation (ledger.windows): rejected
            # until the deadline, shown with the windows the CLI reported.
            windows_record(
                account=profile,
                provider=tool,
                windows=[
                    Window(
                        name=RATE_LIMIT_WINDOW,
                        status=REJECTED,
                        resets_at=deadline,
                        source=SOURCE_RATE_LIMIT,
                    )
                ],
                step_run_id=step_run.pk,
                now=now,
            )
    return row


# --- login failures ---------------------------------------------------------------------------

LOGIN_REASON_CHARS = 500


def account_login_failed_record(
    *, profile: str, reason: str, now: datetime | None = None
) -> bool:
    """Mark the registered account `profile` `login failed` (the agent's words, the time);
    False when no account of that name is registered (nothing to mark).

    Under the admission lock, like a cooldown: pool assignment and step starts read it."""
    now = now_or_default(now)
    with transaction.atomic():
        admission_lock()
        return bool(
            Account.objects.filter(pk=profile).update(
                login_failed_at=now,
                login_failed_reason=clean_text(reason.strip()[:LOGIN_REASON_CHARS]),
                updated_at=now,
            )
        )


def account_login_clear(*, name: str, now: datetime | None = None) -> bool:
    """Clear the account's `login failed` mark; True when there was one."""
    now = now_or_default(now)
    with transaction.atomic():
        admission_lock()
        return bool(
            Account.objects.filter(pk=name, login_failed_at__isnull=False).update(
                login_failed_at=None, login_failed_reason=None, updated_at=now
            )
        )


# --- an operator's clear ----------------------------------------------------------------------

ACCOUNT_TO_CLEAR_NOT_FOUND = "no account named {name!r}"


@dataclass(frozen=True)
class Cleared:
    """What `account_clear` cleared (or, with dry_run, would clear)."""

    name: str
    cooldown_until: datetime | None  # the cooldown's deadline, None when it had none
    windows: tuple[str, ...]  # the exhausted windows whose observations went
    login_failed: bool  # a `login failed` mark was cleared

    @property
    def anything(self) -> bool:
        return bool(self.cooldown_until or self.windows or self.login_failed)

    def text(self) -> str:
        parts = []
        if self.cooldown_until:
            parts.append(f"the cooldown until {self.cooldown_until.isoformat()}")
        if self.windows:
            parts.append(f"exhausted windows {', '.join(self.windows)}")
        if self.login_failed:
            parts.append("the login failed mark")
        return (
            ", ".join(parts) or "nothing (no cooldown, exhausted window or login mark)"
        )


def account_clear(
    *,
    name: str,
    cooldown: bool = True,
    windows: bool = True,
    login: bool = True,
    dry_run: bool = False,
    now: datetime | None = None,
) -> Cleared:
    """Clear what steps' output claimed about the account (docs/operations.md, "Accounts"):
    its cooldown, the observations of its windows that read exhausted, its `login failed`
    mark; an operator's word, or a passing `account check` (the provider's own answer
    outranks what a task printed). Under the admission lock: admission and step starts
    read all three."""
    now = now_or_default(now)
    name = name.strip()
    with transaction.atomic():
        admission_lock()
        row = Account.objects.filter(pk=name).first()
        if row is None:
            raise LedgerError(ACCOUNT_TO_CLEAR_NOT_FOUND.format(name=name))
        cooling = (
            AccountCooldown.objects.filter(pk=name, until__gt=now).first()
            if cooldown
            else None
        )
        spent = (
            tuple(
                w.name
                for w in latest_windows([name], now=now).get(name, [])
                if w.exhausted(now, max_used=1.0)
            )
            if windows
            else ()
        )
        marked = login and row.login_failed_at is not None
        if not dry_run:
            if cooling is not None:
                AccountCooldown.objects.filter(pk=name).update(until=now, reports=0)
            if spent:
                AccountWindow.objects.filter(
                    account_profile=name, window__in=spent
                ).delete()
            if marked:
                Account.objects.filter(pk=name).update(
                    login_failed_at=None, login_failed_reason=None, updated_at=now
                )
    return Cleared(
        name=name,
        cooldown_until=cooling.until if cooling is not None else None,
        windows=spent,
        login_failed=marked,
    )
