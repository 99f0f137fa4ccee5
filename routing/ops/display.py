"""Pure display helpers of the /ops pages: times, deferral snapshots and server-side SVG charts.

No ORM and no clock: callers pass `now`, so the output is a function of its arguments and
tests need no database. Charts are plain SVG strings built with `format_html` (every label is
escaped); there is no JavaScript and nothing loaded from elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from domain import reasons
from ledger.display import duration_text, since_text


def utc_text(value: datetime | None) -> str:
    """`2026-11-29 16:40:03 UTC` (the settings keep every datetime in UTC)."""
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def relative_age(value: datetime | None, now: datetime) -> str:
    """`3 min 5 s ago`, `2 h 5 min ago`, `in 12 min`, `4 d ago` (ledger.display.since_text,
    the admin's `age` with `ago`)."""
    return since_text(value, now)


def elapsed(value: datetime | None, now: datetime) -> str:
    """`42 s`, `5 min 3 s`, `2 h 10 min`, `3 d 4 h` since `value` (blank when unknown):
    ledger.display.duration_text, as the admin's `age`."""
    if value is None:
        return ""
    return duration_text((now - value).total_seconds())


def reason_label(code: str | None) -> str:
    if not code:
        return "(no code)"
    return reasons.LABELS.get(code, code)


# Control characters in text a page shows as it is (a patch): each C0 one but the newline
# and the tab (and a CR ending a line) as its Unicode control picture (ESC is ␛, BEL ␇),
# DEL as ␡, a C1 one as its escape (`\x9b`). Escaping for HTML leaves them in; a browser
# draws nothing for most, and the text pasted into a terminal would act on it.
_SHOWN_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")


def _control_picture(found: re.Match[str]) -> str:
    code = ord(found.group(0))
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"
    return f"\\x{code:02x}"


def visible_controls(text: str) -> str:
    """`text` with its control characters shown (see _SHOWN_CONTROLS), newlines, tabs and
    CRLF line ends kept."""
    return _SHOWN_CONTROLS.sub(_control_picture, text)


# --- deferral snapshots -----------------------------------------------------------------------

# counts_json / limits_json keys (throttle report names) and how an operator reads them.
_SNAPSHOT_ROWS = (
    ("global", "maxActive", "route scope active"),
    ("project", "maxActivePerProject", "project active"),
    ("projectGroup", "maxActivePerProjectGroup", "project group active"),
)


@dataclass(frozen=True)
class SnapshotLine:
    label: str
    seen: str
    limit: str
    full: bool


def deferral_snapshot(
    counts: Mapping[str, Any] | None, limits: Mapping[str, Any] | None
) -> list[SnapshotLine]:
    """What one deferral saw: each count beside its limit, then each pool account's load."""
    counts, limits = counts or {}, limits or {}
    lines = []
    for count_key, limit_key, label in _SNAPSHOT_ROWS:
        if count_key not in counts and limit_key not in limits:
            continue
        seen, limit = counts.get(count_key), limits.get(limit_key)
        lines.append(
            SnapshotLine(
                label=label,
                seen="—" if seen is None else str(seen),
                limit="no cap" if limit is None else str(limit),
                full=isinstance(seen, int) and isinstance(limit, int) and seen >= limit,
            )
        )
    per_profile = limits.get("maxPerProfile")
    accounts = counts.get("accounts")
    cooling = found if isinstance(found := counts.get("cooling"), dict) else {}
    if isinstance(accounts, dict):
        for profile, load in sorted(accounts.items()):
            until = cooling.get(profile)
            lines.append(
                SnapshotLine(
                    label=f"account {profile} load"
                    + (f" (cooling until {until})" if until else ""),
                    seen=str(load),
                    limit="no cap" if not per_profile else str(per_profile),
                    full=bool(until)
                    or (
                        isinstance(per_profile, int)
                        and per_profile > 0
                        and isinstance(load, int)
                        and load >= per_profile
                    ),
                )
            )
    return lines


# --- charts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadBar:
    profile: str
    running: int
    reserved: int
    cap: int | None
    cooling: bool = False


LABEL_W, BAR_W, ROW_H, PAD = 170, 440, 26, 8
# An account's name beside a chart row: the label column grows with the longest name up to
# LABEL_MOST_W; a longer name loses its middle (the whole name is the row's <title>).
LABEL_CHAR_W, LABEL_MOST_CHARS = 7, 40
LABEL_MOST_W = LABEL_CHAR_W * LABEL_MOST_CHARS + 16


def chart_label(name: str) -> str:
    """`name`, or its start and end around an ellipsis when longer than LABEL_MOST_CHARS."""
    if len(name) <= LABEL_MOST_CHARS:
        return name
    keep = LABEL_MOST_CHARS - 1
    return f"{name[: keep - keep // 2]}…{name[-(keep // 2) :]}"


def label_width(names: Sequence[str]) -> int:
    """The label column's width for `names` (at least LABEL_W, at most LABEL_MOST_W)."""
    longest = max((len(chart_label(n)) for n in names), default=0)
    return min(max(LABEL_W, LABEL_CHAR_W * longest + 16), LABEL_MOST_W)


def load_chart_svg(bars: Sequence[LoadBar]) -> SafeString:
    """Horizontal stacked bars: running then reserved steps per account, the cap as a line.

    The scale is shared by every row (the largest load or cap), so bars compare.
    """
    if not bars:
        return mark_safe("")
    scale_max = max(
        [1, *(b.running + b.reserved for b in bars), *(b.cap or 0 for b in bars)]
    )
    unit = BAR_W / scale_max
    label_w = label_width([b.profile for b in bars])
    height = PAD * 2 + ROW_H * len(bars) + 18
    width = label_w + BAR_W + 150
    rows = [
        _load_row(bar, PAD + i * ROW_H, unit, label_w) for i, bar in enumerate(bars)
    ]
    return format_html(
        '<svg class="ops-chart load-chart" xmlns="http://www.w3.org/2000/svg" '
        'width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="Load per account">{}{}</svg>',
        width,
        height,
        width,
        height,
        mark_safe("".join(rows)),
        _load_legend(label_w, height - 6),
    )


def _load_row(bar: LoadBar, y: int, unit: float, label_w: int) -> SafeString:
    """One account's row of the load chart at `y`: its name, its bars, its load beside
    them, and its cap's line."""
    run_w = round(bar.running * unit, 1)
    res_w = round(bar.reserved * unit, 1)
    total = bar.running + bar.reserved
    cap_text = f"cap {bar.cap}" if bar.cap else "no cap"
    over = bar.cap is not None and total >= bar.cap
    summary = (
        f"{bar.profile}: {bar.running} running, {bar.reserved} reserved, {cap_text}"
    )
    if bar.cooling:
        summary += ", cooling down"
    row = format_html(
        '<g class="row{}"><title>{}</title>'
        '<text class="label" x="{}" y="{}" text-anchor="end">{}</text>'
        '<rect class="track" x="{}" y="{}" width="{}" height="{}"></rect>'
        '<rect class="running" x="{}" y="{}" width="{}" height="{}"></rect>'
        '<rect class="reserved" x="{}" y="{}" width="{}" height="{}"></rect>'
        '<text class="value" x="{}" y="{}">{} / {}{}</text></g>',
        " full" if over else "",
        summary,
        label_w - 8,
        y + 16,
        chart_label(bar.profile),
        label_w,
        y + 4,
        BAR_W,
        ROW_H - 8,
        label_w,
        y + 4,
        run_w,
        ROW_H - 8,
        round(label_w + run_w, 1),
        y + 4,
        res_w,
        ROW_H - 8,
        label_w + BAR_W + 8,
        y + 16,
        total,
        bar.cap if bar.cap else "∞",
        " ❄" if bar.cooling else "",
    )
    if not bar.cap:
        return row
    x = round(label_w + bar.cap * unit, 1)
    return row + format_html(
        '<line class="cap" x1="{}" x2="{}" y1="{}" y2="{}"></line>',
        x,
        x,
        y + 1,
        y + ROW_H - 1,
    )


def _load_legend(label_w: int, legend_y: int) -> SafeString:
    """The load chart's legend: running, reserved, the cap's line."""
    return format_html(
        '<g class="legend"><rect class="running" x="{}" y="{}" width="10" height="10"></rect>'
        '<text x="{}" y="{}">running</text>'
        '<rect class="reserved" x="{}" y="{}" width="10" height="10"></rect>'
        '<text x="{}" y="{}">reserved (admitted, not started)</text>'
        '<line class="cap" x1="{}" x2="{}" y1="{}" y2="{}"></line>'
        '<text x="{}" y="{}">--max-per-profile</text></g>',
        label_w,
        legend_y - 9,
        label_w + 14,
        legend_y,
        label_w + 80,
        legend_y - 9,
        label_w + 94,
        legend_y,
        label_w + 320,
        label_w + 320,
        legend_y - 10,
        legend_y + 1,
        label_w + 326,
        legend_y,
    )


CELL_W, CELL_H = 26, 22


def timeline_hours(now: datetime) -> list[datetime]:
    """The 24 UTC hour buckets ending with the current one, oldest first."""
    current = now.replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=23 - i) for i in range(24)]


def timeline_svg(
    accounts: Sequence[str],
    hours: Sequence[datetime],
    counts: Mapping[tuple[str, datetime], int],
) -> SafeString:
    """A 24-hour timeline: one row per account, one cell per UTC hour, shaded by steps started."""
    if not accounts or not hours:
        return mark_safe("")
    peak = max([1, *counts.values()])
    top = 18
    label_w = label_width(accounts)
    width = label_w + CELL_W * len(hours) + 10
    height = top + CELL_H * len(accounts) + 6
    parts: list[SafeString] = []
    for j, hour in enumerate(hours):
        if j % 3 == 0 or j == len(hours) - 1:
            parts.append(
                format_html(
                    '<text class="hour" x="{}" y="12" text-anchor="middle">{}</text>',
                    label_w + j * CELL_W + CELL_W // 2,
                    hour.strftime("%H:00"),
                )
            )
    for i, profile in enumerate(accounts):
        y = top + i * CELL_H
        parts.append(
            format_html(
                '<text class="label" x="{}" y="{}" text-anchor="end">{}</text>',
                label_w - 8,
                y + 15,
                chart_label(profile),
            )
        )
        for j, hour in enumerate(hours):
            n = counts.get((profile, hour), 0)
            opacity = 0 if n == 0 else round(0.2 + 0.8 * n / peak, 2)
            parts.append(
                format_html(
                    "<g><title>{} · {}–{} UTC: {} step{} started</title>"
                    '<rect class="cell{}" x="{}" y="{}" width="{}" height="{}" '
                    'fill-opacity="{}"></rect>{}</g>',
                    profile,
                    hour.strftime("%Y-%m-%d %H:00"),
                    f"{(hour.hour + 1) % 24:02d}:00",
                    n,
                    "" if n == 1 else "s",
                    "" if n else " empty",
                    label_w + j * CELL_W + 1,
                    y + 1,
                    CELL_W - 2,
                    CELL_H - 2,
                    opacity,
                    format_html(
                        '<text class="n" x="{}" y="{}" text-anchor="middle">{}</text>',
                        label_w + j * CELL_W + CELL_W // 2,
                        y + 15,
                        n,
                    )
                    if n
                    else "",
                )
            )
    return format_html(
        '<svg class="ops-chart timeline" xmlns="http://www.w3.org/2000/svg" '
        'width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="Steps started per hour per account, last 24 hours">{}</svg>',
        width,
        height,
        width,
        height,
        mark_safe("".join(parts)),
    )


THROUGHPUT_W, THROUGHPUT_H = 22, 90
# The throughput chart's margins: the count axis on the left, the hours below.
THROUGHPUT_LEFT, THROUGHPUT_TOP, THROUGHPUT_BOTTOM = 34, 8, 30


def throughput_svg(
    hours: Sequence[datetime],
    counts: Mapping[datetime, tuple[int, int]],
    failed_href: str = "",
) -> SafeString:
    """Runs finished per UTC hour: succeeded stacked under failed, one column per hour.

    `counts[hour] = (succeeded, failed)`; hours with nothing get an empty track so the 24
    columns always line up. Every column has a `<title>` with its numbers. With
    `failed_href`, the legend's "failed or timed out (N)" links there (the list of them)."""
    if not hours:
        return mark_safe("")
    peak = max([1, *(ok + bad for ok, bad in counts.values())])
    left, top = THROUGHPUT_LEFT, THROUGHPUT_TOP
    width = left + THROUGHPUT_W * len(hours) + 10
    height = top + THROUGHPUT_H + THROUGHPUT_BOTTOM
    base = top + THROUGHPUT_H
    parts: list[SafeString] = [
        format_html(
            '<text class="hour" x="{}" y="{}" text-anchor="end">{}</text>'
            '<text class="hour" x="{}" y="{}" text-anchor="end">0</text>',
            left - 4,
            top + 9,
            peak,
            left - 4,
            base,
        )
    ]
    for j, hour in enumerate(hours):
        x = left + j * THROUGHPUT_W + 1
        parts.append(_throughput_column(hour, counts.get(hour, (0, 0)), x, peak))
        if j % 3 == 0 or j == len(hours) - 1:
            parts.append(
                format_html(
                    '<text class="hour" x="{}" y="{}" text-anchor="middle">{}</text>',
                    x + THROUGHPUT_W // 2,
                    base + 13,
                    hour.strftime("%H:00"),
                )
            )
    parts.append(_throughput_legend(counts, height, failed_href))
    return format_html(
        '<svg class="ops-chart throughput" xmlns="http://www.w3.org/2000/svg" '
        'width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="Runs finished per hour, last 24 hours">{}</svg>',
        width,
        height,
        width,
        height,
        mark_safe("".join(parts)),
    )


def _throughput_column(
    hour: datetime, ok_bad: tuple[int, int], x: int, peak: int
) -> SafeString:
    """One hour's column at `x`: its track, succeeded under failed, its numbers as the
    title."""
    ok, bad = ok_bad
    top, base = THROUGHPUT_TOP, THROUGHPUT_TOP + THROUGHPUT_H
    ok_h = round(THROUGHPUT_H * ok / peak, 1)
    bad_h = round(THROUGHPUT_H * bad / peak, 1)
    return format_html(
        "<g><title>{}–{} UTC: {} succeeded, {} failed</title>"
        '<rect class="track" x="{}" y="{}" width="{}" height="{}"></rect>'
        '<rect class="ok" x="{}" y="{}" width="{}" height="{}"></rect>'
        '<rect class="bad" x="{}" y="{}" width="{}" height="{}"></rect></g>',
        hour.strftime("%Y-%m-%d %H:00"),
        f"{(hour.hour + 1) % 24:02d}:00",
        ok,
        bad,
        x,
        top,
        THROUGHPUT_W - 2,
        THROUGHPUT_H,
        x,
        round(base - ok_h, 1),
        THROUGHPUT_W - 2,
        ok_h,
        x,
        round(base - ok_h - bad_h, 1),
        THROUGHPUT_W - 2,
        bad_h,
    )


def _throughput_legend(
    counts: Mapping[datetime, tuple[int, int]], height: int, failed_href: str
) -> SafeString:
    """The legend under the columns: succeeded and failed with their totals, the failed
    ones linking to `failed_href` when given."""
    left = THROUGHPUT_LEFT
    total_ok = sum(ok for ok, _ in counts.values())
    total_bad = sum(bad for _, bad in counts.values())
    return format_html(
        '<g class="legend"><rect class="ok" x="{}" y="{}" width="10" height="10"></rect>'
        '<text x="{}" y="{}">succeeded ({})</text>'
        '<rect class="bad" x="{}" y="{}" width="10" height="10"></rect>'
        '{}<text x="{}" y="{}">failed or timed out ({})</text>{}</g>',
        left,
        height - 11,
        left + 14,
        height - 2,
        total_ok,
        left + 140,
        height - 11,
        format_html('<a class="failed-link" href="{}">', failed_href)
        if failed_href
        else "",
        left + 154,
        height - 2,
        total_bad,
        mark_safe("</a>") if failed_href else "",
    )


def options_text(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Drain options as (`--flag`, value) pairs for display, in a stable order."""
    return [
        (f"--{key.replace('_', '-')}", "yes" if value is True else str(value))
        for key, value in sorted(options.items())
        if key != "kind"
    ]


# --- the overview's last drains ---------------------------------------------------------------

# How many drains the overview reads, and how many rows it shows of them.
DRAINS_READ, DRAINS_SHOWN = 50, 10


@dataclass(frozen=True)
class EmptyDrains:
    """Consecutive drains that did nothing, shown as one row."""

    count: int
    first: datetime  # when the oldest of them started
    last: datetime  # when the newest of them started
    names: tuple[str, ...]  # their schedules' names
    empty_run = True  # what the drain table asks of a row


def drain_did_nothing(record: Any) -> bool:
    """A record that considered nothing, held nothing and has no error (as
    routing.drains.retention.EMPTY, held drains kept apart)."""
    return (
        not record.considered
        and not record.fatal
        and record.error is None
        and not record.held_reason
    )


def collapsed_drains(records: Sequence[Any], shown: int = DRAINS_SHOWN) -> list[Any]:
    """The latest drain records (newest first) with each run of two or more that did
    nothing folded into one EmptyDrains row (a 1-minute schedule writes one a minute), at
    most `shown` rows."""
    rows: list[Any] = []
    run: list[Any] = []

    def flush() -> None:
        if len(run) == 1:
            rows.append(run[0])
        elif run:
            names = tuple(sorted({r.name for r in run if r.name}))
            rows.append(
                EmptyDrains(len(run), run[-1].started_at, run[0].started_at, names)
            )
        run.clear()

    for record in records:
        if drain_did_nothing(record):
            run.append(record)
            continue
        flush()
        rows.append(record)
    flush()
    return rows[:shown]
