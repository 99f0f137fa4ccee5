"""Pure helpers of the ops pages: times, snapshots, SVG charts, drain configs (no database)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from ledger.display import duration_text, seconds
from ledger.ids import new_id
from ledger.selectors import id_floor
from ledger.webkit.cells import age as admin_age
from routing.drains.configs import drain_config, strictest
from routing.ops.display import (
    LoadBar,
    deferral_snapshot,
    elapsed,
    load_chart_svg,
    relative_age,
    timeline_svg,
    utc_text,
)

NOW = datetime(2026, 11, 29, 16, 40, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(seconds=5), "5 s ago"),
        (timedelta(minutes=3, seconds=59), "3 min 59 s ago"),
        (timedelta(minutes=3), "3 min ago"),
        (timedelta(hours=2, minutes=5), "2 h 5 min ago"),
        (timedelta(hours=24), "24 h ago"),
        (timedelta(days=3, hours=1), "3 d 1 h ago"),
        (-timedelta(minutes=12, seconds=1), "in 12 min 1 s"),
    ],
)
def test_relative_ages_read_like_a_person_would_say_them(delta, text) -> None:
    assert relative_age(NOW - delta, NOW) == text


@pytest.mark.parametrize(
    "delta",
    [
        timedelta(seconds=0),
        timedelta(seconds=59),
        timedelta(minutes=12, seconds=5),
        timedelta(hours=9, minutes=59, seconds=59),
        timedelta(hours=47),
        timedelta(days=5, hours=2),
        timedelta(days=400),
    ],
)
def test_the_admin_and_ops_say_one_age_the_same_way(delta) -> None:
    """One formatter (ledger.display.duration_text): the admin's age column, the /ops/
    elapsed cells and relative ages describe one row alike (issue 42)."""
    then = NOW - delta
    assert (
        admin_age(then, NOW)
        == elapsed(then, NOW)
        == duration_text(delta.total_seconds())
    )
    assert relative_age(then, NOW) == f"{admin_age(then, NOW)} ago"
    assert seconds(int(delta.total_seconds() * 1000)) == (
        f"{delta.total_seconds():.1f} s"
        if delta < timedelta(seconds=100)
        else admin_age(then, NOW)
    )


def test_times_are_shown_in_utc() -> None:
    assert utc_text(NOW) == "2026-11-29 16:40:03 UTC"
    assert utc_text(None) == "—"


def test_a_snapshot_puts_each_count_beside_its_limit_and_marks_full_ones() -> None:
    lines = deferral_snapshot(
        {
            "global": 2,
            "project": 0,
            "projectGroup": 1,
            "accounts": {"a": 2, "b": 1},
            "cooling": {"b": "2026-11-29T17:00:00+00:00"},
        },
        {"maxActive": 2, "maxActivePerProjectGroup": 3, "maxPerProfile": 2},
    )
    assert [(x.label, x.seen, x.limit, x.full) for x in lines] == [
        ("route scope active", "2", "2", True),
        ("project active", "0", "no cap", False),
        ("project group active", "1", "3", False),
        ("account a load", "2", "2", True),
        ("account b load (cooling until 2026-11-29T17:00:00+00:00)", "1", "2", True),
    ]
    assert deferral_snapshot({}, {}) == []


def test_the_load_chart_scales_bars_to_one_axis_and_escapes_names() -> None:
    svg = str(
        load_chart_svg(
            [
                LoadBar(profile="a", running=2, reserved=0, cap=4),
                LoadBar(profile="<b>", running=1, reserved=1, cap=None, cooling=True),
            ]
        )
    )
    widths = [
        float(w) for w in re.findall(r'class="running"[^>]*width="([\d.]+)"', svg)
    ]
    # scale max is the cap 4: 2 running → half the bar width, 1 running → a quarter.
    assert widths[0] == 2 * widths[1] and widths[0] > 0
    assert "&lt;b&gt;" in svg and "<b>" not in svg
    assert svg.count('<line class="cap"') == 1 + 1  # a's cap, plus the legend's
    assert '<g class="row">' in svg  # a is under its cap
    assert "&lt;b&gt;: 1 running, 1 reserved, no cap, cooling down" in svg
    assert str(load_chart_svg([])) == ""


def test_the_timeline_has_a_cell_per_hour_per_account() -> None:
    hours = [
        NOW.replace(minute=0, second=0) - timedelta(hours=23 - i) for i in range(24)
    ]
    svg = str(
        timeline_svg(["a", "b"], hours, {("a", hours[-1]): 3, ("b", hours[0]): 1})
    )
    assert svg.count('<rect class="cell') == 48
    assert svg.count('class="cell empty"') == 46
    assert "a · 2026-11-29 16:00–17:00 UTC: 3 steps started" in svg
    assert 'fill-opacity="1.0"' in svg  # the peak hour is fully shaded


def test_ids_created_after_a_moment_sort_after_its_floor() -> None:
    moment_ms = int(NOW.timestamp() * 1000)
    assert new_id(moment_ms) >= id_floor(NOW)
    assert new_id(moment_ms - 1) < id_floor(NOW)
    assert new_id(moment_ms + 1) >= id_floor(NOW)


def test_drain_options_give_the_caps_admission_applies() -> None:
    pool = drain_config(
        origin="schedule",
        label="nightly",
        scope="nightly",
        at=None,
        options={"auth_profile_pool": "a,b", "max_active": "3", "provider": "codewith"},
    )
    assert (pool.max_active, pool.pool, pool.max_per_profile) == (3, ("a", "b"), 2)
    disabled = drain_config(
        origin="drain",
        label="x",
        scope="s",
        at=None,
        options={"auth_profile_pool": "a,b", "max_per_profile": 0},
    )
    assert disabled.max_per_profile is None  # 0 switches the guard off
    pinned = drain_config(
        origin="drain",
        label="y",
        scope="s",
        at=None,
        options={"auth_profile_pool": "a,b", "worker_auth_profile": "a"},
    )
    assert pinned.max_per_profile is None  # pins switch pool routing off
    best = strictest([pool, disabled], lambda c: c.max_active or None)
    assert best is not None and best.source is pool
