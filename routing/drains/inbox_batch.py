"""Batched drains: up to K candidates decided in one transaction, one lock hold
(`routing.admission.admit_batch`, with exactly the decisions of one at a time), and
their inbox rows recorded with at most two UPDATEs.

The batch owns its inbox rows before it decides anything: right after the admission lock it
reads, in one statement, which of its rows are still as the drain scanned them (open, same
attempt counter), locking them on PostgreSQL (`FOR UPDATE`; on SQLite `BEGIN IMMEDIATE`
already holds the database's write lock). A row another drain took since the scan is lost
to this drain, as one-at-a-time routing finds when its claim fails: it gets no admission and
no write; only a hold the row already records is still reported (one at a time decides the
pre-check before it claims, and such a hold writes nothing). The rows it owns are recorded,
attempt counter included, at the end.

A failure anywhere rolls the whole batch back: it never writes part of a batch, and its rows
stay as they were (open, for this drain one at a time or a later drain). After an error the
drain routes candidates one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from ledger.lock import admission_lock
from routing.admission import (
    FullCaps,
    Hold,
    RoutePlan,
    RouteRefused,
    RouteResult,
    admit_batch,
    holds_without_lock,
)
from routing.drains.outcomes import INBOX_STATE, hold_record, inbox_claim
from routing.drains.sources import Candidate
from routing.models import OPEN_INBOX_STATES, InboxEvent, InboxState

HoldResult = Callable[[Candidate, Hold, RoutePlan], dict[str, Any]]
"""Builds a hold's result dict (the drain's `held_result`)."""


@dataclass
class Decided:
    """One candidate's outcome: its result dict and what its inbox row should record."""

    candidate: Candidate
    result: dict[str, Any]
    hold: Hold | None = None
    routed: RouteResult | None = None
    # A plan admission refused (nothing written; the drain records it as a route error).
    refused: RouteRefused | None = None


def route_batch(
    pairs: Sequence[tuple[Candidate, RoutePlan]],
    *,
    now: datetime,
    caps: FullCaps,
    shared_pool: bool,
    held: HoldResult,
    max_created: int,
) -> list[Decided | None]:
    """Decide and write `pairs` in order (module docstring).

    `caps` (the caps the drain has seen full) is updated as one-at-a-time routing would.
    Returns the outcomes of the candidates it decided, None for one whose inbox row another
    drain took since the scan: all of them, or those up to the one that made the
    `max_created`th admission (the drain's max_dispatch), or those before the one that found
    the scope (or a shared pool) full, which the drain then holds unread. An error propagates
    with nothing written.
    """
    candidates = [candidate for candidate, _ in pairs]
    plans = [plan for _, plan in pairs]
    holds = holds_without_lock(plans, now=now, caps=caps, shared_pool=shared_pool)
    if holds is not None:
        return _record_holds(
            [
                Decided(c, held(c, hold, plan), hold=hold)
                for (c, plan), hold in zip(pairs, holds, strict=False)
            ],
            now,
        )
    with transaction.atomic():
        admission_lock()
        owned = _own_inbox_rows(candidates)

        def claimable(index: int, hold: Hold | None) -> bool:
            candidate = candidates[index]
            if not candidate.inbox_id or candidate.inbox_id in owned:
                return True
            # Lost since the scan: one at a time would fail its claim, unless the row
            # already records this very hold (a hold it decides before claiming).
            return hold is not None and candidate.recorded_as(
                InboxState.DEFERRED, hold.code, hold.reason
            )

        outcomes = admit_batch(
            plans,
            now=now,
            caps=caps,
            shared_pool=shared_pool,
            max_created=max_created,
            claimable=claimable,
        )
        decided: list[Decided | None] = []
        for (candidate, plan), outcome in zip(pairs, outcomes, strict=False):
            if outcome is None:
                decided.append(None)
            elif isinstance(outcome, RouteRefused):
                decided.append(Decided(candidate, {}, refused=outcome))
            elif isinstance(outcome, Hold):
                decided.append(
                    Decided(candidate, held(candidate, outcome, plan), hold=outcome)
                )
            else:
                decided.append(Decided(candidate, outcome.to_dict(), routed=outcome))
        _record_inbox([d for d in decided if d is not None and not d.refused], now)
    return decided


def _record_holds(holds: list[Decided], now: datetime) -> list[Decided | None]:
    """Claim and record the rows of `holds` that do not record their hold yet (as one at a
    time: one conditional UPDATE each; a row another drain took since the scan is left to
    it and its candidate dropped), in one transaction, in id order (the order a batch
    locks rows in, so the two never deadlock on PostgreSQL)."""
    writes = [
        outcome
        for outcome in holds
        if outcome.candidate.inbox_id
        and outcome.hold is not None
        and not outcome.candidate.recorded_as(
            InboxState.DEFERRED, outcome.hold.code, outcome.hold.reason
        )
    ]
    lost: set[int] = set()
    if writes:
        with transaction.atomic():
            for outcome in sorted(writes, key=lambda o: str(o.candidate.inbox_id)):
                if not inbox_claim(
                    outcome.candidate, **hold_record(outcome.result, now)
                ):
                    lost.add(id(outcome))
    return [None if id(outcome) in lost else outcome for outcome in holds]


def _own_inbox_rows(candidates: Sequence[Candidate]) -> set[str]:
    """The inbox rows of `candidates` still as the drain scanned them (open, same attempt
    counter), locked until the batch ends: one SELECT, under the admission lock. On
    PostgreSQL `FOR UPDATE` (in id order) makes a concurrent claim wait for this batch and
    then fail; on SQLite the transaction already holds the database's write lock."""
    wanted = [c for c in candidates if c.inbox_id]
    if not wanted:
        return set()
    states = [str(s) for s in OPEN_INBOX_STATES]
    match = " OR ".join(["(id = %s AND route_attempts = %s)"] * len(wanted))
    params: list[str | int | None] = [*states]
    for candidate in wanted:
        params += [candidate.inbox_id, candidate.route_attempts]
    lock = (
        " ORDER BY id FOR UPDATE" if connection.features.has_select_for_update else ""
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT id FROM "{InboxEvent._meta.db_table}" '
            f"WHERE state IN ({', '.join(['%s'] * len(states))}) AND ({match}){lock}",
            params,
        )
        return {str(row[0]) for row in cursor.fetchall()}


_ROUTED_FIELDS = [
    "state",
    "work_item",
    "last_reason",
    "reason_code",
    "routed_at",
    "updated_at",
    "route_attempts",
]
_HOLD_FIELDS = [
    "state",
    "last_reason",
    "reason_code",
    "routed_at",
    "updated_at",
    "route_attempts",
]


def _record_inbox(decided: Sequence[Decided], now: datetime) -> None:
    """Record the outcomes on the inbox rows the batch owns (one UPDATE per kind), bumping
    their attempt counters as a claim does. A hold the row already records writes nothing,
    as in one-at-a-time routing."""
    routed: list[InboxEvent] = []
    holds: list[InboxEvent] = []
    for outcome in decided:
        candidate = outcome.candidate
        if not candidate.inbox_id:
            continue
        attempts = candidate.route_attempts + 1
        if outcome.hold is not None:
            if candidate.recorded_as(
                InboxState.DEFERRED, outcome.hold.code, outcome.hold.reason
            ):
                continue
            holds.append(
                InboxEvent(
                    pk=candidate.inbox_id,
                    route_attempts=attempts,
                    **hold_record(outcome.result, now),
                )
            )
        else:
            result = outcome.routed
            assert result is not None
            routed.append(
                InboxEvent(
                    pk=candidate.inbox_id,
                    state=INBOX_STATE[result.kind],
                    work_item=result.work_item,
                    last_reason=result.reason
                    or (result.work_item.last_reason if result.work_item else None),
                    reason_code=result.reason_code,
                    routed_at=now,
                    updated_at=now,
                    route_attempts=attempts,
                )
            )
    if routed:
        InboxEvent.objects.bulk_update(routed, _ROUTED_FIELDS)
    if holds:
        InboxEvent.objects.bulk_update(holds, _HOLD_FIELDS)
