"""Who may see what on the web surfaces (docs/operations.md, "Who sees what"): Django's own
rule, the admin's, applied to /ops/, the JSON API's and /metrics' staff sessions and the
admin's work-item page.

A record shows to an active staff user holding its model's view permission, or its change
permission (which implies view, as in the admin); superusers hold every permission. Every
/ops/ page needs ITEMS; a page or section that shows other records needs theirs as well.
The permission codenames are Django's defaults (`<app>.view_<model>`).
"""

from __future__ import annotations

from typing import Any

ITEMS = "ledger.view_workflowworkitem"
RUNS = "ledger.view_workflowrun"  # a run's commits and patch, as the admin's run page
STEPS = "ledger.view_workflowsteprun"  # a step's output, error and live lines
ACCOUNTS = "ledger.view_account"  # accounts, their load, cooldowns and windows
HOSTS = "ledger.view_host"
DRAINS = "routing.view_drainrecord"
SCHEDULES = "django_q.view_schedule"

# The names templates read (`ops_may.steps`), each one permission.
RECORDS = {
    "items": ITEMS,
    "runs": RUNS,
    "steps": STEPS,
    "accounts": ACCOUNTS,
    "hosts": HOSTS,
    "drains": DRAINS,
    "schedules": SCHEDULES,
}


def _may(user: Any, perm: str) -> bool:
    app, _, codename = perm.partition(".")
    changer = f"{app}.change_{codename.removeprefix('view_')}"
    return bool(user.has_perm(perm) or user.has_perm(changer))


def is_staff(user: Any) -> bool:
    return bool(
        user is not None and user.is_authenticated and user.is_active and user.is_staff
    )


def may_view(user: Any, *perms: str) -> bool:
    """An active staff user holding each view permission (or that model's change one)."""
    return is_staff(user) and all(_may(user, perm) for perm in perms)


def visible(user: Any) -> dict[str, bool]:
    """Which kinds of record `user` may see, by the names of RECORDS."""
    return {name: may_view(user, perm) for name, perm in RECORDS.items()}
