"""The window rule (domain.windows) and its place in pool assignment (domain.pool)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import reasons
from domain.errors import ValidationError
from domain.pool import assign_pool_auth_profiles
from domain.windows import (
    WINDOWS_OFF,
    Observation,
    Window,
    budget_spend,
    frees_at,
    headroom,
    paced_until,
    parse_max_window_used,
    step_spend,
    window_filter,
)

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
SOON = NOW + timedelta(hours=1)
LATER = NOW + timedelta(hours=3)
PAST = NOW - timedelta(minutes=1)
P3 = ["acctA", "acctB", "acctC"]


def w(name: str = "5h", used=None, status=None, resets=SOON, spend=None) -> Window:
    return Window(
        name=name, used=used, status=status, resets_at=resets, source="t", spend=spend
    )


# (windows of one account, max_used) -> (exhausted, frees at)
EXHAUSTED_CASES = [
    ([], 0.9, (False, None)),
    ([w(used=0.42)], 0.9, (False, None)),
    ([w(used=0.9)], 0.9, (True, SOON)),  # at the limit counts as spent
    ([w(used=0.95)], 0.9, (True, SOON)),
    ([w(used=0.95)], 1.0, (False, None)),  # the route raised the limit
    ([w(used=1.0)], 1.0, (True, SOON)),
    ([w(status="rejected")], 0.9, (True, SOON)),  # claude: no number, rejected
    ([w(status="allowed")], 0.9, (False, None)),
    ([w(status="allowed_warning", used=0.93)], 0.9, (True, SOON)),
    ([w(used=0.99, resets=PAST)], 0.9, (False, None)),  # the reset has passed
    ([w(status="rejected", resets=NOW)], 0.9, (False, None)),  # resets exactly now
    ([w(used=0.95, resets=None)], 0.9, (True, None)),  # spent, reset unknown
    # both windows spent: free at the later reset
    (
        [w("5h", used=0.95, resets=SOON), w("7d", used=0.97, resets=LATER)],
        0.9,
        (True, LATER),
    ),
    # only the weekly one spent
    (
        [w("5h", used=0.1, resets=SOON), w("7d", used=0.97, resets=LATER)],
        0.9,
        (True, LATER),
    ),
]


@pytest.mark.parametrize(("windows", "max_used", "expected"), EXHAUSTED_CASES)
def test_an_account_is_spent_until_its_windows_reset(
    windows, max_used, expected
) -> None:
    assert frees_at(windows, NOW, max_used) == expected


HEADROOM_CASES = [
    ([], 1.0),
    ([w(status="allowed")], 1.0),  # no number: nothing known spent
    ([w(used=0.25)], 0.75),
    ([w("5h", used=0.25), w("7d", used=0.6)], 0.4),  # the tighter window counts
    ([w(used=0.8, resets=PAST)], 1.0),  # over: counts for nothing
]


@pytest.mark.parametrize(("windows", "expected"), HEADROOM_CASES)
def test_headroom_is_the_tightest_window_left(windows, expected) -> None:
    assert headroom(windows, NOW) == pytest.approx(expected)


def test_the_filter_keeps_order_and_names_the_spent_members() -> None:
    found = window_filter(
        P3,
        {"acctA": [w(used=0.95)], "acctB": [w(used=0.5)], "acctC": []},
        NOW,
    )
    assert found.kept == ["acctB", "acctC"]
    assert found.exhausted == {"acctA": SOON}
    assert found.headroom == {"acctB": pytest.approx(0.5)}
    assert "acctA: 5h 95%" in found.reason(P3)
    assert found.earliest_reset == SOON


def test_an_account_at_95_percent_is_not_assigned() -> None:
    spent = window_filter(P3, {"acctA": [w(used=0.95)]}, NOW)
    for seed in ("task-42", "spread-me", "s", "a", "defer-1"):
        got = assign_pool_auth_profiles(
            P3, {}, seed, ["worker", "verifier"], 2, windows=spent
        )
        assert not got.deferred
        assert "acctA" not in got.profiles.values()
        assert got.profiles["worker"] != got.profiles["verifier"]


def test_a_reset_makes_the_account_assignable_again() -> None:
    windows = {name: [w(used=0.95)] for name in P3}
    before = assign_pool_auth_profiles(
        P3, {}, "task-42", ["worker"], 2, windows=window_filter(P3, windows, NOW)
    )
    assert before.deferred and before.reason_code == reasons.WINDOW_EXHAUSTED
    after = assign_pool_auth_profiles(
        P3,
        {},
        "task-42",
        ["worker"],
        2,
        windows=window_filter(P3, windows, SOON + timedelta(seconds=1)),
    )
    assert not after.deferred
    plain = assign_pool_auth_profiles(P3, {}, "task-42", ["worker"], 2)
    assert after.profiles == plain.profiles


def test_a_spent_pool_defers_naming_each_window_and_the_earliest_reset() -> None:
    windows = {
        "acctA": [w(used=0.95, resets=LATER)],
        "acctB": [w(status="rejected", resets=SOON)],
    }
    got = assign_pool_auth_profiles(
        ["acctA", "acctB"],
        {"acctA": 1},
        "s",
        ["worker"],
        2,
        windows=window_filter(["acctA", "acctB"], windows, NOW),
    )
    assert got.deferred
    assert got.reason_code == reasons.WINDOW_EXHAUSTED
    assert "acctA: 5h 95%" in got.reason and "acctB: 5h rejected" in got.reason
    assert got.reason.endswith("until 2026-12-04T13:00:00Z")
    assert got.min_load == 0  # the least loaded member, as for every deferral


def test_more_headroom_wins_a_tie_of_load_but_not_a_lower_load() -> None:
    windows = {"acctA": [w(used=0.7)], "acctB": [w(used=0.2)], "acctC": [w(used=0.5)]}
    spent = window_filter(P3, windows, NOW)
    tie = assign_pool_auth_profiles(P3, {}, "task-42", ["worker"], 2, windows=spent)
    assert tie.profiles == {"worker": "acctB"}
    loaded = assign_pool_auth_profiles(
        P3, {"acctB": 1}, "task-42", ["worker"], 2, windows=spent
    )
    assert loaded.profiles == {"worker": "acctC"}


def test_cooldown_is_decided_before_windows() -> None:
    spent = window_filter(["acctA"], {"acctA": [w(used=0.99)]}, NOW)
    got = assign_pool_auth_profiles(
        ["acctA"], {}, "s", ["worker"], 2, cooling=["acctA"], windows=spent
    )
    assert got.reason_code == reasons.COOLDOWN


@given(
    loads=st.dictionaries(st.sampled_from(P3), st.integers(0, 3)),
    seed=st.text(max_size=8),
    cap=st.sampled_from([None, 0, 1, 2]),
)
def test_with_no_window_known_the_assignment_is_unchanged(loads, seed, cap) -> None:
    roles = ["worker", "verifier"]
    empty = window_filter(P3, {}, NOW)
    allowed_only = window_filter(P3, {p: [w(status="allowed")] for p in P3}, NOW)
    plain = assign_pool_auth_profiles(P3, loads, seed, roles, cap)
    assert (
        assign_pool_auth_profiles(P3, loads, seed, roles, cap, windows=empty) == plain
    )
    assert (
        assign_pool_auth_profiles(P3, loads, seed, roles, cap, windows=allowed_only)
        == plain
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (0.5, 0.5),
        ("0.8", 0.8),
        (1, 1.0),
        ("off", "off"),
        (" OFF ", "off"),
    ],
)
def test_max_window_used_accepts_a_fraction(value, expected) -> None:
    assert parse_max_window_used(value) == expected


@pytest.mark.parametrize(
    "value", [0, -0.1, 1.5, "90%", "", True, "nan", [0.5], "of", "offf", "no", "none"]
)
def test_max_window_used_refuses_anything_else(value) -> None:
    with pytest.raises(ValidationError, match="--max-window-used"):
        parse_max_window_used(value)


# Pacing (rule 7): a 5 h window resetting in 1 h has 80 % of its length elapsed.
PACE_CASES = [
    (w(used=0.5, resets=SOON), None),  # 50 % used, 80 % elapsed: on pace
    (w(used=0.85, resets=SOON), SOON - timedelta(hours=5 * 0.15)),  # ahead: wait
    (w(used=0.85, resets=PAST), None),  # over
    (w(name="rate_limit", used=0.99, resets=SOON), None),  # no known length
    (w(status="allowed", resets=SOON), None),  # no number
]


@pytest.mark.parametrize(("window", "expected"), PACE_CASES)
def test_pacing_holds_an_account_ahead_of_its_window(window, expected) -> None:
    assert paced_until(window, NOW) == expected


def test_a_paced_pool_defers_with_window_paced_and_an_unpaced_member_is_kept() -> None:
    windows = {"acctA": [w(used=0.85)], "acctB": [w(used=0.85)]}
    both = window_filter(["acctA", "acctB"], windows, NOW, paced={"acctA", "acctB"})
    got = assign_pool_auth_profiles(
        ["acctA", "acctB"], {}, "s", ["worker"], 2, windows=both
    )
    assert got.deferred and got.reason_code == reasons.WINDOW_PACED
    assert got.reason.endswith("until 2026-12-04T12:15:00Z")
    one = window_filter(["acctA", "acctB"], windows, NOW, paced={"acctA"})
    got = assign_pool_auth_profiles(
        ["acctA", "acctB"], {}, "s", ["worker"], 2, windows=one
    )
    assert got.profiles == {"worker": "acctB"}


# The prediction (rule 3): (windows with a spend estimate, running, max_used) ->
# (exhausted, frees at). The bench's case: two steps of 32 % admitted at 64 %.
PREDICT_CASES = [
    ([w(used=0.64, spend=0.32)], 0, 0.9, (False, None)),  # ends at 96 %
    ([w(used=0.64, spend=0.32)], 1, 0.9, (True, SOON)),  # two of them: 128 %
    ([w(used=0.5, spend=0.25)], 1, 0.9, (False, None)),  # ends exactly at 100 %
    ([w(used=0.5, spend=0.25)], 2, 0.9, (True, SOON)),
    ([w(used=0.0, spend=0.4)], 2, 0.9, (True, SOON)),  # three fresh steps: 120 %
    ([w(used=0.89)], 5, 0.9, (False, None)),  # no spend known: today's rule
    ([w(used=0.95, spend=0.01)], 0, 0.9, (True, SOON)),  # the limit still holds
    ([w(status="allowed", spend=0.3)], 3, 0.9, (False, None)),  # no used fraction
    ([w(used=0.99, spend=0.32, resets=PAST)], 1, 0.9, (False, None)),  # over
    ([w(used=0.7, spend=0.0)], 4, 0.9, (False, None)),  # a step spends nothing
    ([w(used=0.7, spend=0.2, resets=None)], 1, 0.9, (True, None)),  # reset unknown
    # the weekly window runs out, the 5-hour one does not: free at the weekly reset
    (
        [
            w("5h", used=0.2, spend=0.1, resets=SOON),
            w("7d", used=0.8, spend=0.15, resets=LATER),
        ],
        1,
        0.9,
        (True, LATER),
    ),
    ([w(used=0.64, spend=0.32)], 1, 1.0, (True, SOON)),  # 1.0 does not stop it
]


@pytest.mark.parametrize(("windows", "running", "max_used", "expected"), PREDICT_CASES)
def test_an_account_predicted_to_run_out_is_spent_until_its_reset(
    windows, running, max_used, expected
) -> None:
    assert frees_at(windows, NOW, max_used, running) == expected


def test_the_filter_predicts_with_each_members_load() -> None:
    windows = {name: [w(used=0.64, spend=0.32)] for name in P3}
    found = window_filter(P3, windows, NOW, running={"acctA": 1, "acctC": 2})
    assert found.kept == ["acctB"]
    assert found.exhausted == {"acctA": SOON, "acctC": SOON}
    assert "acctA: 5h 64% (32%/step) until 2026-12-04T13:00:00Z" in found.reason(P3)
    got = assign_pool_auth_profiles(
        P3, {"acctA": 1, "acctC": 2}, "task-42", ["worker"], 2, windows=found
    )
    assert got.profiles == {"worker": "acctB"}
    # without the loads nothing is predicted to run out
    assert window_filter(P3, windows, NOW).kept == P3


@given(
    used=st.dictionaries(st.sampled_from(P3), st.floats(0, 1)),
    loads=st.dictionaries(st.sampled_from(P3), st.integers(0, 5)),
)
def test_with_no_spend_known_the_loads_change_nothing(used, loads) -> None:
    windows = {name: [w(used=u)] for name, u in used.items()}
    assert window_filter(P3, windows, NOW, running=loads) == window_filter(
        P3, windows, NOW
    )


BUDGET = 40_000  # tokens in the 5-hour window (`account add --window 5h=40000`)


def est(step_tokens: list[int], running_tokens: int = 0) -> Window:
    """loopsweb's estimate (rule 10) of a window whose finished steps spent `step_tokens`."""
    return Window(
        name="5h",
        used=min(sum(step_tokens) / BUDGET, 1.0),
        resets_at=SOON if step_tokens else None,
        source="loopsweb estimate",
        spend=budget_spend(step_tokens, BUDGET),
        estimated=True,
    )


def test_a_token_budget_keeps_one_steps_expected_spend_in_reserve() -> None:
    """Rules 3 and 10: opencode's 40,000-token budget reached 45,500 (114 %): the estimate
    had no spend (rule 8 reads the provider's observations, and an estimate has none), so a
    step was admitted at 35,500 (89 %, under the 0.9 limit) and spent 10,000 more."""
    finished = [8_000, 9_500, 9_000, 9_000]  # 35,500 tokens: 89 %
    before = Window(name="5h", used=35_500 / BUDGET, resets_at=SOON, estimated=True)
    assert frees_at([before], NOW, 0.9, 0) == (False, None)  # what let it pass
    window = est(finished)
    assert window.spend == pytest.approx(9_500 / BUDGET)  # the max of the latest three
    assert frees_at([window], NOW, 0.9, 0) == (True, SOON)  # 89 % + 24 % > 100 %
    assert "5h 89% (24%/step) until" in window.label()
    # Steps admitted at once: each running step keeps its spend in reserve too.
    two = est([10_000])  # 25 %, 25 %/step
    assert frees_at([two], NOW, 0.9, 2) == (False, None)  # 25 % + 3 x 25 % = 100 %
    assert frees_at([two], NOW, 0.9, 3) == (True, SOON)  # a fourth at once: 125 %


def test_an_estimate_whose_spend_is_unknown_takes_one_step_at_a_time() -> None:
    fresh = est([])  # no step finished within the window yet
    assert fresh.spend is None and fresh.used == 0.0
    assert frees_at([fresh], NOW, 0.9, 0) == (False, None)
    assert frees_at([fresh], NOW, 0.9, 1) == (True, None)  # frees when that one ends
    assert "(spend unknown: one step at a time)" in fresh.label()
    found = window_filter(P3, {"acctA": [fresh]}, NOW, running={"acctA": 1})
    assert found.kept == ["acctB", "acctC"]
    # A provider's window with no spend known is decided on its used fraction (rule 3).
    assert frees_at([w(used=0.0)], NOW, 0.9, 1) == (False, None)


# Rule 10: the finished steps' tokens (oldest first) -> what one step spends of 40,000.
BUDGET_SPEND_CASES = [
    ([], None),
    ([10_000], 0.25),  # one finished step is enough
    ([20_000, 4_000, 6_000, 8_000], 0.2),  # the max of the latest three
    ([0, 0], 0.0),
    ([-5, 4_000], 0.1),  # a negative count spends nothing
]


@pytest.mark.parametrize(("tokens", "expected"), BUDGET_SPEND_CASES)
def test_a_budgets_spend_is_the_latest_steps_tokens_over_the_budget(tokens, expected):
    got = budget_spend(tokens, BUDGET)
    assert got == (None if expected is None else pytest.approx(expected))
    assert budget_spend(tokens, 0) is None


@given(step=st.integers(1_000, 60_000), cap=st.integers(1, 8))
def test_a_budget_is_never_passed_by_more_than_one_steps_spend(step, cap) -> None:
    """Admissions and step starts as the ledger runs them: a step starts while the rule
    keeps the account (`running`: the steps in flight, at most `cap` at once, the
    route's --max-per-profile), else one running step ends and its tokens count in the
    estimate, until nothing can start. Every step spends `step` tokens."""
    finished: list[int] = []
    in_flight = 0
    while True:
        window = est(finished)
        if (
            in_flight < cap
            and window_filter(
                ["acctA"], {"acctA": [window]}, NOW, running={"acctA": in_flight}
            ).kept
        ):
            in_flight += 1
        elif in_flight:
            in_flight -= 1
            finished.append(step)
        else:
            break
    assert sum(finished) <= max(BUDGET, step) <= BUDGET + step


T0 = NOW - timedelta(minutes=30)


def o(run, used, minute, resets=SOON) -> Observation:
    return Observation(
        step_run=run,
        used=used,
        resets_at=resets,
        observed_at=T0 + timedelta(minutes=minute),
    )


# Rule 8: observations (oldest first) -> what one step spends.
SPEND_CASES = [
    ([], None),
    ([o("r1", 0.16, 0), o("r1", 0.32, 1)], None),  # one step run: nothing to compare
    # each run's last observation: 0.32 -> 0.64
    ([o("r1", 0.16, 0), o("r1", 0.32, 1), o("r2", 0.48, 2), o("r2", 0.64, 3)], 0.32),
    # the second run was seen after the first one's reset: another period
    ([o("r1", 0.32, 1, resets=T0 + timedelta(minutes=2)), o("r2", 0.2, 3)], None),
    ([o("r1", 0.5, 1), o("r2", 0.3, 2)], None),  # the used fraction fell
    ([o(None, 0.1, 0), o("r1", 0.3, 1), o(None, 0.9, 2)], None),  # not step runs
    ([o("r1", None, 0), o("r2", 0.4, 1)], None),  # no used fraction
    # the max of the latest three increases (0.5 is older than them)
    (
        [o("r1", 0.0, 0), o("r2", 0.5, 1), o("r3", 0.6, 2), o("r4", 0.8, 3)]
        + [o("r5", 0.85, 4)],
        0.2,
    ),
    # a run observed again later counts at its last observation
    ([o("r1", 0.1, 0), o("r2", 0.3, 1), o("r1", 0.5, 2)], 0.2),
]


@pytest.mark.parametrize(("observations", "expected"), SPEND_CASES)
def test_a_steps_spend_is_the_increase_between_step_runs(observations, expected):
    got = step_spend(observations)
    assert got == (None if expected is None else pytest.approx(expected))


def test_off_looks_at_no_window_and_assigns_an_account_at_95_percent() -> None:
    """Rule 9: spent, rejected, predicted and paced members are all kept, no headroom."""
    windows = {
        "acctA": [w(used=0.95)],
        "acctB": [w(status="rejected")],
        "acctC": [w(used=0.64, spend=0.32)],  # predicted to run out with one step on it
    }
    off = window_filter(P3, windows, NOW, WINDOWS_OFF, paced=P3, running={"acctC": 1})
    assert (off.kept, off.exhausted, off.paced, off.headroom) == (P3, {}, {}, {})
    on = window_filter(P3, windows, NOW, paced=P3, running={"acctC": 1})
    assert on.kept == [] and set(on.exhausted) == set(P3)
    for seed in ("task-42", "spread-me", "s", "a", "defer-1"):
        plain = assign_pool_auth_profiles(P3[:1], {}, seed, ["worker"], 2)
        got = assign_pool_auth_profiles(P3[:1], {}, seed, ["worker"], 2, windows=off)
        assert got == plain and got.profiles == {"worker": "acctA"}
        spent = window_filter(P3[:1], windows, NOW)
        refused = assign_pool_auth_profiles(
            P3[:1], {}, seed, ["worker"], 2, windows=spent
        )
        assert refused.deferred and refused.reason_code == reasons.WINDOW_EXHAUSTED
