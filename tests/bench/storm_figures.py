"""The storm benchmark's figures from the windows stand-in's request log
(tests/bench/storm_agent.py) and loopsweb's window rows: pure functions, no ORM, no
processes (tests/bench/bench_storm.py runs the storm and reports them)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Pool:
    """The stand-in's script: the accounts in order (account i's windows start
    round(i × window / n) after the epoch's), requests per window, window seconds."""

    accounts: tuple[str, ...]
    capacity: int
    window: int


def read_requests(state_dir: Path) -> list[dict[str, Any]]:
    """The stand-in's requests, oldest first, each with its end (None if it never ended)."""
    path = state_dir / "requests.jsonl"
    starts: dict[str, dict[str, Any]] = {}
    ends: dict[str, float] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        entry = json.loads(line)
        if "start" in entry:
            starts[entry["id"]] = entry
        else:
            ends[entry["id"]] = entry["end"]
    for key, entry in starts.items():
        entry["end"] = ends.get(key)
    return sorted(starts.values(), key=lambda r: r["start"])


def spent_report(pool: Pool, request: dict[str, Any]) -> bool:
    """Did this request's output say the window is spent (a 429, or `rejected`)?"""
    return not request["answered"] or request["used"] >= pool.capacity


def spent_row(row: dict[str, Any], at: float) -> bool:
    return (
        row["status"] == "rejected"
        and row["resets_at"] is not None
        and row["resets_at"].timestamp() > at
    )


def newest_spent(rows: list[dict[str, Any]], account: str, at: float) -> bool:
    """Whether loopsweb's newest row of one of `account`'s windows (ledger.windows
    `latest_windows`: by observation) said spent at `at`."""
    newest: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda row: row["observed_at"]):
        if row["account_profile"] == account and row["observed_at"].timestamp() <= at:
            newest[row["window"]] = row
    return any(spent_row(row, at) for row in newest.values())


def refused(
    pool: Pool, requests: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> tuple[int, int, int, int]:
    """(requests refused; of them, sent after a finished request on the same account had
    reported the same window spent; sent while loopsweb held a `rejected` row of the
    account; sent while its newest row of a window said so). Each refused request is
    marked `told`, `known` (with `known_for`, seconds) and `newest` accordingly."""
    refusals = [r for r in requests if not r["answered"]]
    for r in refusals:
        r["told"] = any(
            q["account"] == r["account"]
            and q["window"] == r["window"]
            and q["end"] is not None
            and q["end"] <= r["start"]
            and spent_report(pool, q)
            for q in requests
        )
        seen = [
            row["observed_at"].timestamp()
            for row in rows
            if row["account_profile"] == r["account"]
            and row["observed_at"].timestamp() <= r["start"]
            and spent_row(row, r["start"])
        ]
        r["known"] = bool(seen)
        # How long before the agent started loopsweb held the first such row.
        r["known_for"] = round(r["start"] - min(seen), 2) if seen else None
        r["newest"] = newest_spent(rows, r["account"], r["start"])
    return (
        len(refusals),
        sum(1 for r in refusals if r["told"]),
        sum(1 for r in refusals if r["known"]),
        sum(1 for r in refusals if r["newest"]),
    )


def stretches(pool: Pool, requests: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The stretches (start, earliest reset) in which every account's window was spent."""
    spent: dict[str, list[tuple[float, float]]] = {a: [] for a in pool.accounts}
    for r in requests:
        if r["answered"] and r["used"] == pool.capacity and r["account"] in spent:
            spent[r["account"]].append((r["start"], r["reset"]))
    edges = sorted({t for spans in spent.values() for span in spans for t in span})
    found: list[tuple[float, float]] = []
    for a, b in zip(edges, edges[1:], strict=False):
        middle = (a + b) / 2
        if all(any(s <= middle < e for s, e in spent[x]) for x in pool.accounts):
            if found and found[-1][1] == a:
                found[-1] = (found[-1][0], b)
            else:
                found.append((a, b))
    return found


def resumes(
    pool: Pool, requests: list[dict[str, Any]], admissions: list[float]
) -> list[tuple[float, float, float | None]]:
    """Per stretch with work left after it: (its length, earliest reset → first answered
    request, earliest reset → first admission)."""
    answered = [r["start"] for r in requests if r["answered"]]
    out = []
    for start, reset in stretches(pool, requests):
        after = [t for t in answered if t >= reset]
        if not after:
            continue  # the storm was over: no work was left
        admitted = [t for t in admissions if t >= reset]
        out.append(
            (
                reset - start,
                min(after) - reset,
                min(admitted) - reset if admitted else None,
            )
        )
    return out


def share(
    pool: Pool, requests: list[dict[str, Any]], epoch: float, backlog_end: float
) -> tuple[int, int, int]:
    """(requests answered, capacity, windows) over the account windows that began at or
    after `epoch` and ended by `backlog_end`."""
    windows: set[tuple[str, int]] = set()
    for position, account in enumerate(pool.accounts):
        offset = epoch + round(pool.window * position / len(pool.accounts))
        index = math.ceil((epoch - offset) / pool.window)
        while offset + (index + 1) * pool.window <= backlog_end:
            windows.add((account, index))
            index += 1
    delivered = sum(
        1 for r in requests if r["answered"] and (r["account"], r["window"]) in windows
    )
    return delivered, pool.capacity * len(windows), len(windows)
