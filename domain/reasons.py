"""Stable reason codes for deferrals.

Contract: every deferral stores one of these codes next to the upstream-style human reason
(docs/design.md, "every wait can be explained"). Codes are persisted and used as filter
values on the ops pages, so they never change once released; add new codes instead.
"""

from __future__ import annotations

ROUTE_CAP = "route_cap"
PROJECT_CAP = "project_cap"
GROUP_CAP = "group_cap"
PROFILE_CAP = "profile_cap"
COOLDOWN = "cooldown"
ACCOUNT_DISABLED = "account_disabled"
LOGIN_FAILED = "login_failed"
WINDOW_EXHAUSTED = "window_exhausted"
WINDOW_PACED = "window_paced"
UNRESPONSIVE = "unresponsive"

ALL: tuple[str, ...] = (
    ROUTE_CAP,
    PROJECT_CAP,
    GROUP_CAP,
    PROFILE_CAP,
    COOLDOWN,
    ACCOUNT_DISABLED,
    LOGIN_FAILED,
    WINDOW_EXHAUSTED,
    WINDOW_PACED,
    UNRESPONSIVE,
)

LABELS: dict[str, str] = {
    ROUTE_CAP: "Route scope limit (--max-active)",
    PROJECT_CAP: "Project limit (--max-active-per-project)",
    GROUP_CAP: "Project group limit (--max-active-per-project-group)",
    PROFILE_CAP: "All pool accounts at capacity (--max-per-profile)",
    COOLDOWN: "All pool accounts cooling down",
    ACCOUNT_DISABLED: "All pool accounts disabled in the account registry",
    LOGIN_FAILED: "All pool accounts' logins failed (account check to clear)",
    WINDOW_EXHAUSTED: "All pool accounts at their window budget (--max-window-used)",
    WINDOW_PACED: "All pool accounts ahead of their window pace (--window-pace)",
    UNRESPONSIVE: "All pool accounts unresponsive (a step hung on each; account clear)",
}
