"""Account cooldowns after a provider rate limit: the latest deadline wins; the backoff
grows with repeated reports (agents.ratelimit). And the other way an account stops taking
work by itself: a refused login (`account_login_failed_record`), which lasts until someone
clears it (`account_login_clear`: `account check` finding the login works, `account
enable`), because no wait makes a revoked key good again.

What a step printed goes through the `*_report` functions: bounded per task, and a cooldown
longer than 15 minutes stands 15 minutes unless loopsweb's own request confirms it
(ledger.claims); the `*_record` functions record as told.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from agents.ratelimit import cooldown_backoff
from domain.windows import REJECTED, Window
from ledger.claims import (
    COOLDOWN,
    LOGIN,
    MARKED_EVENT,
    PARKED_EVENT,
    PARKED_REASONS,
    TASK_PARKED,
    UNCONFIRMED_LONGEST,
    UNCONFIRMED_REASON,
    Claim,
    held_reason,
    task_runs,
    unconfirmed_minutes,
)
from ledger.lock import admission_lock
from ledger.models import (
    Account,
    AccountCooldown,
    AccountWindow,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from ledger.selectors import account_state
from ledger.services.common import (
    LedgerError,
    append_event,
    clean_text,
    now_or_default,
)
from ledger.services.failover import run_pool
from ledger.services.notifications import notify_login_failed
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

    What a step printed goes through `account_cooldown_report` (the task's bound and the
    15 minutes unconfirmed, ledger.claims); this records as told (an operator, a test,
    the provider's own answer to loopsweb's request)."""
    now = now_or_default(now)
    with transaction.atomic():
        admission_lock()
        row, _ = _cooldown_write(
            profile=profile,
            tool=tool,
            until=until,
            reason=reason,
            step_run=step_run,
            now=now,
        )
    return row


def _cooldown_write(
    *,
    profile: str,
    tool: str | None,
    until: datetime | None,
    reason: str,
    step_run: WorkflowStepRun | None,
    now: datetime,
    longest: timedelta | None = None,
) -> tuple[AccountCooldown, datetime]:
    """`account_cooldown_record`'s write, under the caller's admission lock; with `longest`,
    a deadline further than that is cut to it and the reason says unconfirmed. Returns
    the row and the deadline as claimed (before the cut)."""
    cap = float(settings.LOOPSWEB_COOLDOWN_CAP_SECONDS)
    row = (
        AccountCooldown.objects.select_for_update(no_key=True)
        .filter(pk=profile)
        .first()
    )
    in_episode = row is not None and row.until > now - timedelta(seconds=cap)
    reports = row.reports + 1 if row is not None and in_episode else 1
    claimed = until
    if claimed is None:
        claimed = now + cooldown_backoff(
            reports=reports,
            base_seconds=float(settings.LOOPSWEB_COOLDOWN_BASE_SECONDS),
            cap_seconds=cap,
        )
    deadline = claimed
    if longest is not None and claimed > now + longest:
        deadline = now + longest
        reason = UNCONFIRMED_REASON.format(
            minutes=unconfirmed_minutes(), claimed=claimed.isoformat(), reason=reason
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
    return row, claimed


# --- what a step reported: bounded (ledger.claims) ---------------------------------------------


@dataclass(frozen=True)
class Report:
    """What a step's report about its account did: `taken` (the account is marked), else
    `parked` (the task's reason: a second account reported the same, not marked; `held`: the
    task waits, ledger/claims.py, "the bound", rather than ending); `claim`, a cooldown
    claimed for longer than 15 minutes, to confirm (`confirm_enqueue`)."""

    taken: bool
    parked: str | None = None
    held: bool = False
    claim: Claim | None = None


def _task_bound(
    run: WorkflowRun,
    step: WorkflowStepRun,
    profile: str,
    kind: str,
    *,
    claimed: datetime | None = None,
    now: datetime | None = None,
) -> str | None:
    """ledger/claims.py, "the bound", under the admission lock and the run row: None when
    `profile` may be marked (the task's first account of `kind`, or the one it marked
    already), with an `account_marked` event the first time; else the parked reason, with a
    `task_parked` event. A rate limit's park holds the task (the event's `until`,
    `_hold_end`)."""
    marked: set[str] = set()
    parks = 0
    for event_type, payload in WorkflowEvent.objects.filter(
        workflow_run_id__in=task_runs(run), event_type__in=(MARKED_EVENT, PARKED_EVENT)
    ).values_list("event_type", "payload_json"):
        if not isinstance(payload, dict) or payload.get("kind") != kind:
            continue
        if event_type == MARKED_EVENT:
            marked.add(str(payload.get("account")))
        else:
            parks += 1
    others = sorted(marked - {profile})
    if not others:
        if profile not in marked:
            append_event(
                run.id,
                MARKED_EVENT,
                step_id=step.step_id,
                payload={"account": profile, "kind": kind},
            )
        return None
    reason = PARKED_REASONS[kind]
    payload = {
        "code": TASK_PARKED,
        "kind": kind,
        "account": profile,
        "marked": others[0],
        "reason": reason,
    }
    if kind == COOLDOWN:
        now = now_or_default(now)
        until = _hold_end(claimed, parks, now)
        reset = _pool_reset(run, now)
        if reset is not None and reset < until:
            until = reset  # an account of its pool is free again before: try then
        payload["until"] = until.isoformat()
        # The item says why it waits (its run ends with its own words).
        WorkflowWorkItem.objects.filter(pk=run.work_item_id).update(
            last_reason=held_reason(until), updated_at=now
        )
    append_event(run.id, PARKED_EVENT, step_id=step.step_id, payload=payload)
    return reason


def _pool_reset(run: WorkflowRun, now: datetime) -> datetime | None:
    """The earliest end of a cooldown among the run's pool members (a pool-routed run), so
    a held task tries again as soon as one of them is free, not at its own claim's end."""
    context = run_pool(run)
    if context is None:
        return None
    cooling = account_state(now=now, accounts=context[1]).cooling
    ends = [end for end in cooling.values() if end > now]
    return min(ends) if ends else None


def _hold_end(claimed: datetime | None, parks: int, now: datetime) -> datetime:
    """When a task parked for a rate limit may try again (ledger/claims.py, "the bound"):
    the end the step claimed, else the cooldown backoff growing with the task's earlier
    parks; never more than UNCONFIRMED_LONGEST from now."""
    if claimed is None:
        claimed = now + cooldown_backoff(
            reports=parks + 1,
            base_seconds=float(settings.LOOPSWEB_COOLDOWN_BASE_SECONDS),
            cap_seconds=float(settings.LOOPSWEB_COOLDOWN_CAP_SECONDS),
        )
    return max(now, min(claimed, now + UNCONFIRMED_LONGEST))


def _lock_run(step: WorkflowStepRun) -> WorkflowRun:
    return WorkflowRun.objects.select_for_update(no_key=True).get(
        pk=step.workflow_run_id
    )


def account_cooldown_report(
    *,
    step_run: WorkflowStepRun,
    tool: str | None,
    until: datetime | None,
    reason: str,
    now: datetime | None = None,
) -> Report:
    """A step reported a rate limit for its account (`step_run.account_profile`): the
    task's bound first (ledger/claims.py, "the bound"), then the cooldown, at most 15
    minutes unless confirmed ("the confirmation": the returned `claim`, to queue once this
    commits)."""
    now = now_or_default(now)
    profile = step_run.account_profile or ""
    with transaction.atomic():
        admission_lock()
        run = _lock_run(step_run)
        parked = _task_bound(run, step_run, profile, COOLDOWN, claimed=until, now=now)
        if parked is not None:
            return Report(taken=False, parked=parked, held=True)
        row, claimed = _cooldown_write(
            profile=profile,
            tool=tool,
            until=until,
            reason=reason,
            step_run=step_run,
            now=now,
            longest=UNCONFIRMED_LONGEST,
        )
    if claimed <= row.until:
        return Report(taken=True)
    claim = Claim(
        account=profile, kind=COOLDOWN, until=claimed, reason=reason, tool=tool
    )
    return Report(taken=True, claim=claim)


def account_login_failed_report(
    *, step_run: WorkflowStepRun, reason: str, now: datetime | None = None
) -> Report:
    """A failed step named an authentication error for its account: the task's bound
    (ledger/claims.py, "the bound"), then the `login failed` mark (`taken`: False also when no
    account of that name is registered)."""
    now = now_or_default(now)
    profile = step_run.account_profile or ""
    with transaction.atomic():
        admission_lock()
        run = _lock_run(step_run)
        if not Account.objects.filter(pk=profile).exists():
            return Report(taken=False)
        parked = _task_bound(run, step_run, profile, LOGIN)
        if parked is not None:
            return Report(taken=False, parked=parked)
        return Report(
            taken=account_login_failed_record(profile=profile, reason=reason, now=now)
        )


# --- login failures ---------------------------------------------------------------------------

LOGIN_REASON_CHARS = 500


def account_login_failed_record(
    *, profile: str, reason: str, now: datetime | None = None
) -> bool:
    """Mark the registered account `profile` `login failed` (the agent's words, the time);
    False when no account of that name is registered (nothing to mark).

    Under the admission lock, like a cooldown: pool assignment and step starts read it."""
    now = now_or_default(now)
    mark = {
        "login_failed_at": now,
        "login_failed_reason": clean_text(reason.strip()[:LOGIN_REASON_CHARS]),
        "updated_at": now,
    }
    with transaction.atomic():
        admission_lock()
        # A new mark begins an episode an operator is told about, once (docs/operations.md
        # "Notifications"); a mark renewed by the next refused step is the same episode.
        if Account.objects.filter(pk=profile, login_failed_at__isnull=True).update(
            **mark
        ):
            notify_login_failed(account=profile, reason=reason, since=now)
            return True
        return bool(Account.objects.filter(pk=profile).update(**mark))


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


# --- unresponsive accounts -------------------------------------------------------------------


def account_unresponsive_record(
    *, profile: str, reason: str, now: datetime | None = None
) -> datetime | None:
    """Mark the registered account `profile` `unresponsive` after its step made no progress
    for its idle limit (a hang): until now + LOOPSWEB_UNRESPONSIVE_SECONDS, with the step's
    words. Returns that end, None when no account of that name is registered (nothing to
    mark). A later mark moves the end on; pool assignment, step starts and failover skip the
    account until then (docs/operations.md, "A hung account cools off").

    Under the admission lock, like a cooldown: pool assignment and step starts read it."""
    now = now_or_default(now)
    until = now + timedelta(seconds=int(settings.LOOPSWEB_UNRESPONSIVE_SECONDS))
    with transaction.atomic():
        admission_lock()
        marked = Account.objects.filter(pk=profile).update(
            unresponsive_until=until,
            unresponsive_reason=clean_text(reason.strip()[:LOGIN_REASON_CHARS]),
            updated_at=now,
        )
    return until if marked else None


# --- an operator's clear ----------------------------------------------------------------------

ACCOUNT_TO_CLEAR_NOT_FOUND = "no account named {name!r}"


@dataclass(frozen=True)
class Cleared:
    """What `account_clear` cleared (or, with dry_run, would clear)."""

    name: str
    cooldown_until: datetime | None  # the cooldown's deadline, None when it had none
    windows: tuple[str, ...]  # the exhausted windows whose observations went
    login_failed: bool  # a `login failed` mark was cleared
    # the end of an `unresponsive` mark that was cleared (with the cooldown), None: none
    unresponsive_until: datetime | None = None

    @property
    def anything(self) -> bool:
        return bool(
            self.cooldown_until
            or self.windows
            or self.login_failed
            or self.unresponsive_until
        )

    def text(self) -> str:
        parts = []
        if self.cooldown_until:
            parts.append(f"the cooldown until {self.cooldown_until.isoformat()}")
        if self.windows:
            parts.append(f"exhausted windows {', '.join(self.windows)}")
        if self.login_failed:
            parts.append("the login failed mark")
        if self.unresponsive_until:
            parts.append(
                f"the unresponsive mark until {self.unresponsive_until.isoformat()}"
            )
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
    its cooldown (and with it an `unresponsive` mark), the observations of its windows that
    read exhausted, its `login failed` mark; an operator's word, or a passing `account check` (the provider's own answer
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
        hung = (
            row.unresponsive_until
            if cooldown
            and row.unresponsive_until is not None
            and row.unresponsive_until > now
            else None
        )
        if not dry_run:
            if hung is not None:
                Account.objects.filter(pk=name).update(
                    unresponsive_until=None, unresponsive_reason=None, updated_at=now
                )
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
        unresponsive_until=hung,
    )
