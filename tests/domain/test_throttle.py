from __future__ import annotations

import pytest

from domain import reasons
from domain.errors import ValidationError
from domain.throttle import (
    AdmissionDecision,
    ThrottleCounts,
    ThrottleLimits,
    admission_decision,
    parse_limit,
    pool_deferral_decision,
)

PATH = "/srv/repos/app"


def decide(
    counts: ThrottleCounts, limits: ThrottleLimits, group: str | None = None
) -> AdmissionDecision:
    return admission_decision(
        scope="drain-a",
        project_path=PATH,
        project_group=group,
        counts=counts,
        limits=limits,
    )


def test_no_limits_allow_everything() -> None:
    limits = ThrottleLimits()
    assert not limits.any_set
    decision = decide(
        ThrottleCounts(scope=99, project=99, project_group=99), limits, "g"
    )
    assert decision.allowed
    assert decision.reason is None
    assert decision.reason_code is None


@pytest.mark.parametrize(
    "limits",
    [
        ThrottleLimits(max_active=1),
        ThrottleLimits(max_active_per_project=1),
        ThrottleLimits(max_active_per_project_group=1),
    ],
)
def test_any_single_limit_counts_as_set(limits: ThrottleLimits) -> None:
    assert limits.any_set


def test_route_scope_cap_is_full_at_equality() -> None:
    limits = ThrottleLimits(max_active=3)
    assert decide(ThrottleCounts(scope=2), limits).allowed
    decision = decide(ThrottleCounts(scope=3), limits)
    assert not decision.allowed
    assert decision.reason == "scope drain-a active workflow limit reached (3/3)"
    assert decision.reason_code == reasons.ROUTE_CAP


def test_project_cap_is_full_at_equality() -> None:
    limits = ThrottleLimits(max_active_per_project=2)
    assert decide(ThrottleCounts(project=1), limits).allowed
    decision = decide(ThrottleCounts(project=5), limits)
    assert decision.reason == "project active workflow limit reached (5/2)"
    assert decision.reason_code == reasons.PROJECT_CAP


def test_group_cap_is_full_at_equality() -> None:
    limits = ThrottleLimits(max_active_per_project_group=4)
    assert decide(ThrottleCounts(project_group=3), limits, "oss").allowed
    decision = decide(ThrottleCounts(project_group=4), limits, "oss")
    assert decision.reason == "project-group active workflow limit reached (4/4)"
    assert decision.reason_code == reasons.GROUP_CAP


def test_group_cap_is_ignored_when_no_group_is_set() -> None:
    limits = ThrottleLimits(max_active_per_project_group=1)
    assert decide(ThrottleCounts(project_group=7), limits, None).allowed
    assert decide(ThrottleCounts(project_group=7), limits, "   ").allowed


def test_route_scope_cap_is_checked_before_project_and_group_caps() -> None:
    limits = ThrottleLimits(1, 1, 1)
    full = ThrottleCounts(scope=1, project=1, project_group=1)
    assert decide(full, limits, "g").reason_code == reasons.ROUTE_CAP


def test_project_cap_is_checked_before_group_cap() -> None:
    limits = ThrottleLimits(5, 1, 1)
    counts = ThrottleCounts(scope=0, project=1, project_group=1)
    assert decide(counts, limits, "g").reason_code == reasons.PROJECT_CAP


def test_group_cap_denies_when_route_and_project_have_room() -> None:
    limits = ThrottleLimits(5, 5, 2)
    counts = ThrottleCounts(scope=0, project=0, project_group=2)
    assert decide(counts, limits, "g").reason_code == reasons.GROUP_CAP


def test_scope_and_group_are_trimmed() -> None:
    decision = admission_decision(
        scope="  drain-a ",
        project_path=PATH,
        project_group=" oss ",
        counts=ThrottleCounts(scope=1),
        limits=ThrottleLimits(max_active=1),
    )
    assert decision.scope == "drain-a"
    assert decision.project_group == "oss"
    assert decision.reason == "scope drain-a active workflow limit reached (1/1)"


def test_denied_decision_report_shape_with_group() -> None:
    limits = ThrottleLimits(max_active=3, max_active_per_project_group=2)
    counts = ThrottleCounts(scope=3, project=1, project_group=2)
    assert decide(counts, limits, "oss").to_dict() == {
        "allowed": False,
        "reason": "scope drain-a active workflow limit reached (3/3)",
        "reasonCode": "route_cap",
        "routeScope": "drain-a",
        "projectPath": PATH,
        "projectGroup": "oss",
        "limits": {"maxActive": 3, "maxActivePerProjectGroup": 2},
        "counts": {"global": 3, "project": 1, "projectGroup": 2},
    }


def test_allowed_decision_report_omits_reason_and_group() -> None:
    limits = ThrottleLimits(max_active_per_project=2)
    assert decide(ThrottleCounts(scope=4, project=1), limits).to_dict() == {
        "allowed": True,
        "routeScope": "drain-a",
        "projectPath": PATH,
        "limits": {"maxActivePerProject": 2},
        "counts": {"global": 4, "project": 1},
    }


def test_pool_deferral_decision_reports_zero_counts_when_none_were_taken() -> None:
    decision = pool_deferral_decision(
        scope="todos-task",
        project_path=PATH,
        project_group=None,
        counts=None,
        limits=ThrottleLimits(),
        reason="per-profile active limit reached (all 2 pool members >= 1 running; min 1)",
        reason_code=reasons.PROFILE_CAP,
    )
    assert decision.to_dict() == {
        "allowed": False,
        "reason": "per-profile active limit reached (all 2 pool members >= 1 running; min 1)",
        "reasonCode": "profile_cap",
        "routeScope": "todos-task",
        "projectPath": PATH,
        "limits": {},
        "counts": {"global": 0, "project": 0},
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), ("  ", None), (3, 3), ("12", 12), (" 7 ", 7)],
)
def test_parse_limit_accepts_positive_integers_and_blank(
    value: object, expected: int | None
) -> None:
    assert parse_limit("--max-active", value) == expected


@pytest.mark.parametrize(
    "value", [0, "0", -1, "-1", "1.5", 1.0, True, "abc", "+3", "1e2", "²", [1]]
)
def test_parse_limit_rejects_non_positive_and_non_integer_values(value: object) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_limit("--max-active", value)
    assert str(exc.value) == "--max-active must be a positive integer"


def test_parse_limit_with_allow_zero_accepts_zero() -> None:
    assert parse_limit("--max-per-profile", 0, allow_zero=True) == 0
    assert parse_limit("--max-per-profile", "0", allow_zero=True) == 0


@pytest.mark.parametrize("value", [-1, "-2", "x", False])
def test_parse_limit_with_allow_zero_rejects_negative_values(value: object) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_limit("--max-per-profile", value, allow_zero=True)
    assert str(exc.value) == "--max-per-profile must be a non-negative integer"


def test_reason_codes_are_listed_and_labelled() -> None:
    assert reasons.ALL == (
        "route_cap",
        "project_cap",
        "group_cap",
        "profile_cap",
        "cooldown",
        "account_disabled",
        "login_failed",
        "window_exhausted",
        "window_paced",
        "unresponsive",
    )
    assert set(reasons.LABELS) == set(reasons.ALL)
