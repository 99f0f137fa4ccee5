"""Active-workflow throttle decision (docs/upstream.md §3.7, with the later upstream wording).

Contract:
1. Counts are taken by the caller from ledger rows inside the deciding transaction:
   ``scope`` = active items with this route scope, ``project`` = active items for the
   normalized project path across all routes, ``project_group`` = active items in the
   group across all routes (``None`` when no group is set).
2. Decision order, first match wins, ``>=`` means full:
   route scope cap (``route_cap``), project cap (``project_cap``), group cap
   (``group_cap``, only when a group is set).
3. Unset limits never deny; ``ThrottleLimits.any_set`` tells the caller whether a
   decision is worth reporting at all.
4. The scope reason is ``scope <scope> active workflow limit reached (<n>/<max>)``;
   the later upstream label, not 0.4.12's ``global ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain import reasons
from domain.bounds import bounded_int

SCOPE_LIMIT_REASON = "scope {scope} active workflow limit reached ({count}/{limit})"
PROJECT_LIMIT_REASON = "project active workflow limit reached ({count}/{limit})"
GROUP_LIMIT_REASON = "project-group active workflow limit reached ({count}/{limit})"


@dataclass(frozen=True)
class ThrottleLimits:
    max_active: int | None = None
    max_active_per_project: int | None = None
    max_active_per_project_group: int | None = None

    @property
    def any_set(self) -> bool:
        return (
            self.max_active is not None
            or self.max_active_per_project is not None
            or self.max_active_per_project_group is not None
        )

    def to_dict(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.max_active is not None:
            out["maxActive"] = self.max_active
        if self.max_active_per_project is not None:
            out["maxActivePerProject"] = self.max_active_per_project
        if self.max_active_per_project_group is not None:
            out["maxActivePerProjectGroup"] = self.max_active_per_project_group
        return out


@dataclass(frozen=True)
class ThrottleCounts:
    scope: int = 0
    project: int = 0
    project_group: int | None = None

    def to_dict(self, *, include_group: bool) -> dict[str, int]:
        # The report key stays ``global`` (upstream's name) although the count is scoped.
        out = {"global": self.scope, "project": self.project}
        if include_group:
            out["projectGroup"] = self.project_group or 0
        return out


@dataclass(frozen=True)
class AdmissionDecision:
    allowed: bool
    reason: str | None
    reason_code: str | None
    counts: ThrottleCounts
    limits: ThrottleLimits
    scope: str
    project_path: str
    project_group: str | None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"allowed": self.allowed}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.reason_code is not None:
            out["reasonCode"] = self.reason_code
        out["routeScope"] = self.scope
        out["projectPath"] = self.project_path
        if self.project_group:
            out["projectGroup"] = self.project_group
        out["limits"] = self.limits.to_dict()
        out["counts"] = self.counts.to_dict(include_group=bool(self.project_group))
        return out


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    return value.strip() or None


def admission_decision(
    *,
    scope: str,
    project_path: str,
    project_group: str | None,
    counts: ThrottleCounts,
    limits: ThrottleLimits,
) -> AdmissionDecision:
    """Allow or deny one admission against the three caps (see module docstring)."""
    group = _clean(project_group)
    scope = scope.strip()

    def deny(reason: str, code: str) -> AdmissionDecision:
        return AdmissionDecision(
            allowed=False,
            reason=reason,
            reason_code=code,
            counts=counts,
            limits=limits,
            scope=scope,
            project_path=project_path,
            project_group=group,
        )

    if limits.max_active is not None and counts.scope >= limits.max_active:
        return deny(
            SCOPE_LIMIT_REASON.format(
                scope=scope, count=counts.scope, limit=limits.max_active
            ),
            reasons.ROUTE_CAP,
        )
    if (
        limits.max_active_per_project is not None
        and counts.project >= limits.max_active_per_project
    ):
        return deny(
            PROJECT_LIMIT_REASON.format(
                count=counts.project, limit=limits.max_active_per_project
            ),
            reasons.PROJECT_CAP,
        )
    if group is not None and limits.max_active_per_project_group is not None:
        group_count = counts.project_group or 0
        if group_count >= limits.max_active_per_project_group:
            return deny(
                GROUP_LIMIT_REASON.format(
                    count=group_count, limit=limits.max_active_per_project_group
                ),
                reasons.GROUP_CAP,
            )
    return AdmissionDecision(
        allowed=True,
        reason=None,
        reason_code=None,
        counts=counts,
        limits=limits,
        scope=scope,
        project_path=project_path,
        project_group=group,
    )


def pool_deferral_decision(
    *,
    scope: str,
    project_path: str,
    project_group: str | None,
    counts: ThrottleCounts | None,
    limits: ThrottleLimits,
    reason: str,
    reason_code: str,
) -> AdmissionDecision:
    """The synthetic denied decision reported when only the pool deferred (docs/upstream.md
    §3.6, "a made-up denial").

    Upstream reports zero counts when no throttle limit was set (no counts were taken).
    """
    return AdmissionDecision(
        allowed=False,
        reason=reason,
        reason_code=reason_code,
        counts=counts if counts is not None else ThrottleCounts(),
        limits=limits,
        scope=scope.strip(),
        project_path=project_path,
        project_group=_clean(project_group),
    )


def parse_limit(flag: str, value: object, *, allow_zero: bool = False) -> int | None:
    """Parse a limit option given as int or decimal text (see domain.bounds).

    ``None`` and blank text mean "unset". Anything else must be a whole number, at
    least 1 (or at least 0 with ``allow_zero``, used by ``--max-per-profile``), and at most
    the flag's bound. Floats and bools are rejected even when integral: they only reach here
    by mistake.
    """
    return bounded_int(flag, value, minimum=0 if allow_zero else 1)
