"""The admin login's two lock-out rules (django-axes; docs/settings.md).

django-axes counts failed logins per rule in AXES_LOCKOUT_PARAMETERS and locks a rule out at
one AXES_FAILURE_LIMIT for all rules. loopsweb wants two rules with two limits:
1. **the configured rule** (LOOPSWEB_LOGIN_LOCKOUT_BY, default one username from one
   address) at LOOPSWEB_LOGIN_FAILURE_LIMIT (AXES_FAILURE_LIMIT);
2. **the address rule**: one address across every username at the higher
   LOOPSWEB_LOGIN_IP_FAILURE_LIMIT, so an address cannot try many usernames a few times
   each.
`lockout_parameters` is AXES_LOCKOUT_PARAMETERS as a callable: it answers the configured
rule until the address has LOOPSWEB_LOGIN_IP_FAILURE_LIMIT failures within the cool-off,
then the address rule, whose count is then past AXES_FAILURE_LIMIT too, so axes refuses
(429). A successful login resets only what the configured rule covers
(AXES_RESET_ON_SUCCESS), never the address's count.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Sum
from django.http import HttpRequest

ADDRESS_RULE: list[Any] = ["ip_address"]


def address_failures(request: HttpRequest) -> int:
    """Failed logins from the request's address within the cool-off, any username."""
    from axes.attempts import get_cool_off_threshold
    from axes.models import AccessAttempt

    address = getattr(request, "axes_ip_address", None)
    if address is None:
        return 0
    attempts = AccessAttempt.objects.filter(ip_address=address)
    if settings.AXES_COOLOFF_TIME is not None:
        attempts = attempts.filter(attempt_time__gte=get_cool_off_threshold(request))
    total = attempts.aggregate(total=Sum("failures_since_start"))["total"]
    return int(total or 0)


def lockout_parameters(
    request_or_attempt: Any, credentials: dict[str, Any] | None = None
) -> list[Any]:
    rule: list[Any] = settings.LOOPSWEB_LOGIN_LOCKOUT_RULE
    # axes also asks about a stored attempt (resets, cache keys): the configured rule is the
    # answer there.
    if rule == ADDRESS_RULE or not isinstance(request_or_attempt, HttpRequest):
        return rule
    if address_failures(request_or_attempt) >= settings.LOOPSWEB_LOGIN_IP_FAILURE_LIMIT:
        return ADDRESS_RULE
    return rule
