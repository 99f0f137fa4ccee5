"""The confirmation of what a step claimed about its account (ledger/claims.py, "the
confirmation"; the django-q2 task `runs.tasks.confirm_account_claim`).

A cooldown or exhausted window claimed for longer than 15 minutes was recorded for 15
minutes, "unconfirmed". Here loopsweb makes the smallest request a step would make with the
account, as `account check` does (runs.account_check.account_request: outside any
task, in a throwaway directory, in its own sandbox):
- the provider answers with a rate limit (agents.ratelimit.detect_rate_limit on the
  request's output and exit code): confirmed, the claim stands until its claimed end, under
  the caps that hold for any report (a cooldown at most MAX_DEADLINE, a window at most its
  own length); its reason says confirmed;
- anything else (answered, another error, no request possible, an account not in the
  registry): the 15 minutes stand, nothing more is written.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.utils import timezone

from agents.ratelimit import detect_rate_limit
from domain.windows import Window
from ledger.claims import COOLDOWN, WINDOW, Claim
from ledger.models import Account
from ledger.services.cooldowns import account_cooldown_record
from ledger.windows import windows_record
from runs.account_check import account_request
from runs.providers import ProviderError, rate_limit_exit_codes

logger = logging.getLogger(__name__)

CONFIRMED = "confirmed"
UNCONFIRMED = "unconfirmed"
CONFIRMED_REASON = (
    "confirmed by loopsweb's own request with the account (a rate limit): {reason}"
)


def confirm_claim(claim: Claim, *, now: datetime | None = None) -> str:
    """Make the account's request and let the claim stand when the provider itself answers
    with a rate limit (module docstring); CONFIRMED or UNCONFIRMED."""
    row = Account.objects.filter(pk=claim.account).first()
    if row is None or claim.kind not in (COOLDOWN, WINDOW):
        return UNCONFIRMED
    try:
        code, stdout, stderr = account_request(row)
    except ProviderError as exc:
        logger.warning("could not confirm the claim about %s: %s", row.name, exc)
        return UNCONFIRMED
    now = now or timezone.now()
    answer = detect_rate_limit(
        output=f"{stdout}\n{stderr}",
        exit_code=code,
        rate_limit_exit_codes=rate_limit_exit_codes(row.provider),
        now=now,
    )
    if answer is None:
        logger.info("the claim about %s is not confirmed (exit %s)", row.name, code)
        return UNCONFIRMED
    reason = CONFIRMED_REASON.format(reason=claim.reason)
    if claim.kind == COOLDOWN:
        account_cooldown_record(
            profile=row.name,
            tool=claim.tool,
            until=claim.until,
            reason=reason,
            now=now,
        )
        return CONFIRMED
    seen = claim.window or {}
    used = seen.get("used")
    windows_record(
        account=row.name,
        provider=claim.tool,
        windows=[
            Window(
                name=str(seen.get("window") or ""),
                used=float(used) if isinstance(used, int | float) else None,
                status=seen.get("status")
                if isinstance(seen.get("status"), str)
                else None,
                resets_at=claim.until,
                source=reason,
                observed_at=now,
            )
        ],
        now=now,
    )
    return CONFIRMED
