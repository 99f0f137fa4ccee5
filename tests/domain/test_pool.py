from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import reasons
from domain.pool import (
    DEFAULT_MAX_PER_PROFILE,
    ROLE_ORDER,
    PoolAssignment,
    assign_pool_auth_profiles,
    fnv1a_32,
    max_per_profile_in_force,
    max_per_profile_recorded,
    order_roles,
    parse_pool,
    render_time_profile,
    role_offset,
    select_least_loaded,
    stable_index,
)

P3 = ["acctA", "acctB", "acctC"]
LIFECYCLE = ["triage", "planner", "worker", "verifier"]

# docs/upstream.md §4.6 hash table: seed, FNV-1a-32, mod 2, mod 3, mod 4.
HASH_TABLE = [
    ("task-42", 0x5B1CD835, 1, 1, 1),
    ("task-lifecycle-seed", 0xB4460DFD, 1, 0, 1),
    ("spread-me", 0x5BE3133B, 1, 0, 3),
    ("distinct-verifier", 0x8D4D0FDE, 0, 2, 2),
    ("s", 0xF60C4582, 0, 1, 2),
    ("spread-1", 0x168CA2B8, 0, 1, 0),
    ("defer-1", 0xC7A46069, 1, 0, 1),
    ("scope-a1", 0x8C3E89C8, 0, 2, 0),
    ("task-dedupe-regression-1", 0x8D4816D4, 0, 0, 0),
    ("todos:task.created:evt-1", 0x7DD97A5E, 0, 0, 2),
    ("", 0x811C9DC5, 1, 1, 1),
    ("a", 0xE40C292C, 0, 1, 0),
    ("\u00e9", 0x6C0B6C44, 0, 1, 0),
    ("\U0001f600", 0xCB31C4B8, 0, 2, 0),
]


@pytest.mark.parametrize(("seed", "expected", "mod2", "mod3", "mod4"), HASH_TABLE)
def test_hash_table_row_matches_reference(
    seed: str, expected: int, mod2: int, mod3: int, mod4: int
) -> None:
    assert fnv1a_32(seed) == expected
    assert stable_index(seed, 2) == mod2
    assert stable_index(seed, 3) == mod3
    assert stable_index(seed, 4) == mod4


def test_hash_of_ascii_equals_bytewise_fnv1a() -> None:
    h = 2166136261
    for byte in b"todos:task.created:evt-1":
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    assert fnv1a_32("todos:task.created:evt-1") == h


def test_hash_of_a_lone_surrogate_hashes_it_as_one_code_unit() -> None:
    # JSON may carry an unpaired surrogate; JS hashes it as one code unit.
    expected = ((2166136261 ^ 0xD83D) * 16777619) & 0xFFFFFFFF
    assert fnv1a_32("\ud83d") == expected


def test_stable_index_rejects_an_empty_pool_size() -> None:
    with pytest.raises(ValueError):
        stable_index("x", 0)


def test_role_offsets_are_worker_verifier_planner_then_three() -> None:
    assert [role_offset(r) for r in ROLE_ORDER] == [0, 1, 2, 3]
    assert role_offset("reviewer") == 3


def test_roles_are_ordered_by_priority_then_given_order_without_duplicates() -> None:
    roles = ["reviewer", "triage", "verifier", "worker", "worker", "extra", "reviewer"]
    assert order_roles(roles) == ["worker", "verifier", "triage", "reviewer", "extra"]


# docs/upstream.md §4.3 selection


def test_selection_ties_resolve_in_walk_order_from_the_anchor() -> None:
    loads = {"acctA": 1, "acctB": 1, "acctC": 1}
    assert select_least_loaded(P3, loads, 0, set()) == "acctA"
    assert select_least_loaded(P3, loads, 1, set()) == "acctB"
    assert select_least_loaded(P3, loads, 2, set()) == "acctC"


def test_selection_prefers_a_lower_load_later_in_the_walk() -> None:
    assert select_least_loaded(P3, {"acctA": 2, "acctB": 1}, 0, set()) == "acctC"


def test_selection_prefers_a_free_member_over_a_less_loaded_excluded_one() -> None:
    loads = {"acctA": 0, "acctB": 5, "acctC": 9}
    assert select_least_loaded(P3, loads, 0, {"acctA"}) == "acctB"


def test_selection_with_every_member_excluded_falls_back_to_least_load() -> None:
    loads = {"acctA": 3, "acctB": 1, "acctC": 1}
    assert select_least_loaded(P3, loads, 0, set(P3)) == "acctB"


def test_selection_treats_missing_loads_as_zero() -> None:
    assert select_least_loaded(P3, {"acctA": 1}, 0, set()) == "acctB"


def test_selection_of_an_empty_pool_raises() -> None:
    with pytest.raises(ValueError):
        select_least_loaded([], {}, 0, set())


# docs/upstream.md §4.6 worked examples


def test_example_1_cold_store_lifecycle_roles_reproduce_the_hash_assignment() -> None:
    result = assign_pool_auth_profiles(P3, {}, "task-lifecycle-seed", LIFECYCLE)
    assert result.profiles == {
        "worker": "acctA",
        "verifier": "acctB",
        "planner": "acctC",
        "triage": "acctA",
    }
    assert not result.deferred
    for role in LIFECYCLE:
        assert (
            render_time_profile(P3, "task-lifecycle-seed", role)
            == result.profiles[role]
        )


def test_example_2_worker_avoids_a_loaded_hash_pick() -> None:
    assert render_time_profile(P3, "task-42", "worker") == "acctB"
    result = assign_pool_auth_profiles(P3, {"acctB": 4}, "task-42", ["worker"])
    assert result.profiles == {"worker": "acctC"}


def test_example_3_verifier_lands_on_a_distinct_account_with_walk_order_tie() -> None:
    loads = {"acctA": 3, "acctB": 0, "acctC": 3}
    result = assign_pool_auth_profiles(
        P3, loads, "distinct-verifier", ["worker", "verifier"]
    )
    assert result.profiles == {"worker": "acctB", "verifier": "acctA"}


def test_example_4_equal_non_zero_load_spreads_in_hash_order() -> None:
    loads = {"acctA": 1, "acctB": 1, "acctC": 1}
    result = assign_pool_auth_profiles(
        P3, loads, "spread-me", ["worker", "verifier", "planner"]
    )
    assert result.profiles == {
        "worker": "acctA",
        "verifier": "acctB",
        "planner": "acctC",
    }
    assert result.min_load == 1


def test_example_5_route_spread_1_with_guard_disabled() -> None:
    loads = {"acctA": 2, "acctC": 1, "acctB": 0}
    result = assign_pool_auth_profiles(P3, loads, "spread-1", LIFECYCLE, 0)
    assert result.profiles == {
        "worker": "acctB",
        "verifier": "acctC",
        "planner": "acctA",
        "triage": "acctB",
    }
    assert result.profiles["worker"] == "acctB"
    assert not result.deferred


def test_example_6_route_defer_1_defers_when_both_members_are_at_the_cap() -> None:
    result = assign_pool_auth_profiles(
        ["acctA", "acctB"], {"acctA": 1, "acctB": 1}, "defer-1", ["worker"], 1
    )
    assert result == PoolAssignment(
        profiles={},
        deferred=True,
        min_load=1,
        reason="per-profile active limit reached (all 2 pool members >= 1 running; min 1)",
        reason_code=reasons.PROFILE_CAP,
    )


def test_example_7_headroom_on_one_member_admits_onto_it() -> None:
    loads = {"acctA": 2, "acctB": 1, "acctC": 2}
    result = assign_pool_auth_profiles(P3, loads, "s", ["worker"], 2)
    assert not result.deferred
    assert result.min_load == 1
    assert result.profiles == {"worker": "acctB"}


def test_example_8_saturated_pool_defers() -> None:
    loads = {"acctA": 2, "acctB": 2, "acctC": 2}
    result = assign_pool_auth_profiles(P3, loads, "s", ["worker"], 2)
    assert result.deferred
    assert result.profiles == {}
    assert result.min_load == 2
    assert (
        result.reason
        == "per-profile active limit reached (all 3 pool members >= 2 running; min 2)"
    )
    assert result.reason_code == reasons.PROFILE_CAP


# docs/upstream.md §4.4 edge rules


def test_blank_pool_entries_are_dropped_before_hashing() -> None:
    padded = ["", "acctA", "  ", "acctB", "acctC", "\t"]
    assert assign_pool_auth_profiles(
        padded, {}, "task-lifecycle-seed", LIFECYCLE
    ) == assign_pool_auth_profiles(P3, {}, "task-lifecycle-seed", LIFECYCLE)


def test_an_empty_pool_assigns_nothing_and_does_not_defer() -> None:
    result = assign_pool_auth_profiles(["", " "], {"x": 9}, "s", ["worker"], 1)
    assert result == PoolAssignment(profiles={}, deferred=False, min_load=0)


@pytest.mark.parametrize("max_per_profile", [None, 0])
def test_max_per_profile_none_or_zero_never_defers(max_per_profile: int | None) -> None:
    loads = {"acctA": 50, "acctB": 50, "acctC": 50}
    result = assign_pool_auth_profiles(P3, loads, "s", ["worker"], max_per_profile)
    assert not result.deferred
    # All loads tie, so the walk from the hash pick ("s" mod 3 = 1) keeps acctB.
    assert result.profiles == {"worker": "acctB"}
    assert result.min_load == 50


def test_the_guard_counts_duplicate_members_in_the_reason() -> None:
    result = assign_pool_auth_profiles(
        ["acctA", "acctA"], {"acctA": 3}, "s", ["worker"], 3
    )
    assert result.reason == (
        "per-profile active limit reached (all 2 pool members >= 3 running; min 3)"
    )


def test_loads_are_not_incremented_between_roles() -> None:
    # A duplicated member makes the snapshot observable: were acctA's load bumped
    # after the worker and planner took it, triage would move to acctB.
    pool = ["acctA", "acctA", "acctB"]
    result = assign_pool_auth_profiles(pool, {}, "a", LIFECYCLE)
    assert result.profiles == {
        "worker": "acctA",
        "verifier": "acctB",
        "planner": "acctA",
        "triage": "acctA",
    }


def test_unknown_roles_are_assigned_after_the_known_ones() -> None:
    result = assign_pool_auth_profiles(
        P3, {}, "task-lifecycle-seed", ["reviewer", "worker"]
    )
    assert list(result.profiles) == ["worker", "reviewer"]
    assert result.profiles == {"worker": "acctA", "reviewer": "acctB"}


def test_pool_assignment_to_dict_uses_camel_case() -> None:
    deferred = assign_pool_auth_profiles(
        P3, {"acctA": 2, "acctB": 2, "acctC": 2}, "s", ["worker"], 2
    )
    assert deferred.to_dict() == {
        "profiles": {},
        "deferred": True,
        "minLoad": 2,
        "reason": "per-profile active limit reached (all 3 pool members >= 2 running; min 2)",
        "reasonCode": "profile_cap",
    }
    assert assign_pool_auth_profiles(P3, {}, "s", ["worker"]).to_dict() == {
        "profiles": {"worker": "acctB"},
        "deferred": False,
        "minLoad": 0,
    }


# Cooldown extension


def test_cooling_members_are_skipped() -> None:
    result = assign_pool_auth_profiles(
        P3, {}, "task-lifecycle-seed", ["worker", "verifier"], 2, cooling={"acctA"}
    )
    assert not result.deferred
    assert set(result.profiles.values()) == {"acctB", "acctC"}
    assert result.profiles == {"worker": "acctC", "verifier": "acctB"}


def test_an_all_cooling_pool_defers_with_the_cooldown_code() -> None:
    result = assign_pool_auth_profiles(
        P3, {"acctA": 1}, "s", ["worker"], 2, cooling=set(P3)
    )
    assert result == PoolAssignment(
        profiles={},
        deferred=True,
        min_load=0,
        reason="all 3 pool members cooling down",
        reason_code=reasons.COOLDOWN,
    )


def test_cooldown_defers_even_with_the_guard_disabled() -> None:
    result = assign_pool_auth_profiles(P3, {}, "s", ["worker"], 0, cooling=P3)
    assert result.deferred
    assert result.reason_code == reasons.COOLDOWN


def test_the_guard_applies_to_the_members_that_are_not_cooling() -> None:
    loads = {"acctA": 0, "acctB": 2, "acctC": 2}
    result = assign_pool_auth_profiles(P3, loads, "s", ["worker"], 2, cooling={"acctA"})
    assert result.reason_code == reasons.PROFILE_CAP
    assert result.reason == (
        "per-profile active limit reached (all 2 pool members >= 2 running; min 2)"
    )


def test_cooling_names_outside_the_pool_change_nothing() -> None:
    for seed in ("task-42", "spread-1", "s"):
        assert assign_pool_auth_profiles(
            P3, {"acctB": 1}, seed, LIFECYCLE, 2, cooling={"other"}
        ) == assign_pool_auth_profiles(P3, {"acctB": 1}, seed, LIFECYCLE, 2)


# Render-time default


def test_render_time_profile_of_a_single_member_pool_is_that_member() -> None:
    for role in ROLE_ORDER:
        assert render_time_profile(["only"], "task-42", role) == "only"


def test_render_time_profile_of_an_empty_pool_is_none() -> None:
    assert render_time_profile([" "], "task-42", "worker") is None


def test_render_time_profile_offsets_each_role_from_the_worker() -> None:
    # "spread-me" mod 4 = 3.
    pool = ["p0", "p1", "p2", "p3"]
    assert [render_time_profile(pool, "spread-me", r) for r in ROLE_ORDER] == [
        "p3",
        "p0",
        "p1",
        "p2",
    ]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.text(max_size=20),
    size=st.integers(min_value=4, max_value=8),
    load=st.integers(min_value=0, max_value=5),
)
def test_equal_loads_reproduce_the_render_time_pick_for_every_role(
    seed: str, size: int, load: int
) -> None:
    pool = [f"acct{i}" for i in range(size)]
    loads = dict.fromkeys(pool, load)
    result = assign_pool_auth_profiles(pool, loads, seed, LIFECYCLE)
    for role in LIFECYCLE:
        assert result.profiles[role] == render_time_profile(pool, seed, role)


# --- loopsweb: the account registry (disabled accounts, per-account caps) ---------------------


def test_disabled_members_are_never_assigned() -> None:
    result = assign_pool_auth_profiles(
        P3, {}, "task-42", ["worker", "planner"], 2, disabled=["acctB", "acctC"]
    )
    assert not result.deferred
    assert set(result.profiles.values()) == {"acctA"}


# --- loopsweb: worker ≠ verifier, always (contract 8) ------------------------------------------


def test_one_enabled_member_defers_a_verifier_rather_than_share_the_worker_s() -> None:
    result = assign_pool_auth_profiles(
        P3, {}, "task-42", ["worker", "verifier"], 2, disabled=["acctB", "acctC"]
    )
    assert result.deferred and result.reason_code == reasons.ACCOUNT_DISABLED
    assert result.reason == (
        "worker ≠ verifier: no pool member but acctA can take the verifier "
        "(every other member is disabled)"
    )
    failed = assign_pool_auth_profiles(
        P3,
        {},
        "s",
        ["worker", "verifier"],
        0,
        login_failed=["acctB"],
        disabled=["acctC"],
    )
    assert failed.deferred and failed.reason_code == reasons.LOGIN_FAILED
    assert failed.reason is not None and "account acctB: login failed" in failed.reason


@pytest.mark.parametrize(
    "aside",
    [
        {"cooling": ["acctB", "acctC"]},
        {"account_caps": {"acctB": 1, "acctC": 1}},
    ],
)
def test_one_free_member_takes_the_worker_and_the_verifier_one_set_aside(
    aside: dict[str, Any],
) -> None:
    loads = {"acctB": 3, "acctC": 1}
    result = assign_pool_auth_profiles(
        P3, loads, "task-42", LIFECYCLE, 0, disabled=[], **aside
    )
    assert not result.deferred
    # The worker on the one free member; the verifier on the least loaded other one,
    # where it moves or waits at its start (ledger.services.failover rule 3).
    assert result.profiles["worker"] == "acctA"
    assert result.profiles["verifier"] == "acctC"
    assert result.profiles["planner"] == "acctA"  # other roles may share, as upstream


def test_a_pool_naming_one_account_twice_defers_a_verifier() -> None:
    result = assign_pool_auth_profiles(
        ["acctA", "acctA"], {}, "s", ["worker", "verifier"]
    )
    assert result.deferred
    assert result.reason is not None and "names no other account" in result.reason


def test_a_wholly_disabled_pool_defers_with_its_own_reason_code() -> None:
    result = assign_pool_auth_profiles(
        P3, {}, "task-42", ["worker"], 2, cooling=["acctA"], disabled=P3
    )
    assert result.deferred and result.reason_code == reasons.ACCOUNT_DISABLED
    assert result.reason == "all 3 pool members disabled in the account registry"


def test_disabled_then_cooling_leaves_nothing_and_defers_as_cooldown() -> None:
    result = assign_pool_auth_profiles(
        P3, {}, "s", ["worker"], 2, cooling=["acctA"], disabled=["acctB", "acctC"]
    )
    assert result.deferred and result.reason_code == reasons.COOLDOWN


def test_an_account_cap_tightens_max_per_profile_for_that_member_only() -> None:
    loads = {"acctA": 1, "acctB": 1, "acctC": 1}
    capped = assign_pool_auth_profiles(
        P3, loads, "task-42", ["worker", "verifier"], 4, account_caps={"acctB": 1}
    )
    assert not capped.deferred and "acctB" not in capped.profiles.values()
    full = assign_pool_auth_profiles(
        P3, loads, "task-42", ["worker"], 4, account_caps={p: 1 for p in P3}
    )
    assert full.deferred and full.reason_code == reasons.PROFILE_CAP


@given(
    loads=st.dictionaries(st.sampled_from(P3), st.integers(0, 5)),
    seed=st.text(max_size=8),
    limit=st.one_of(st.none(), st.integers(0, 4)),
)
@settings(max_examples=200, deadline=None)
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_with_no_registry_facts_the_result_is_upstreams(
    loads: dict[str, int], seed: str, limit: int | None
) -> None:
    plain = assign_pool_auth_profiles(P3, loads, seed, LIFECYCLE, limit)
    assert plain == assign_pool_auth_profiles(
        P3, loads, seed, LIFECYCLE, limit, disabled=(), account_caps={}
    )


def test_parse_pool_trims_text_keeps_list_members_and_drops_blanks() -> None:
    assert parse_pool(" a, b ,,c , ") == ["a", "b", "c"]
    assert parse_pool(None) == []
    assert parse_pool("") == []
    assert parse_pool(7) == []
    # A list keeps its members as given (upstream hashes them untrimmed), blanks dropped.
    assert parse_pool(["a", " b", "", "  "]) == ["a", " b"]
    assert parse_pool(("a", 3)) == ["a", "3"]


@pytest.mark.parametrize(
    ("option", "routes", "recorded", "in_force"),
    [
        (None, True, DEFAULT_MAX_PER_PROFILE, DEFAULT_MAX_PER_PROFILE),
        (3, True, 3, 3),
        (0, True, 0, None),  # 0 switches the guard off
        (None, False, None, None),  # no pool routing: no guard
        (3, False, 3, None),
    ],
)
def test_the_max_per_profile_default_is_one_rule(
    option: int | None, routes: bool, recorded: int | None, in_force: int | None
) -> None:
    assert max_per_profile_recorded(option, pool_routes=routes) == recorded
    assert max_per_profile_in_force(option, pool_routes=routes) == in_force
