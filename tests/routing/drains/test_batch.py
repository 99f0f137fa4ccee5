"""Batched admission in drains (routing.drains.inbox_batch): the same decisions as one at a time,
fewer statements, nothing half-written when a batch fails. On both databases."""

from __future__ import annotations

import random
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.models import (
    AccountCooldown,
    WorkflowRun,
    WorkflowWorkItem,
)
from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from tests.account_loads import assert_account_counts_match_rows
from tests.routing.helpers import drain_rows, generic_event, wipe_drain_rows

pytestmark = pytest.mark.django_db

POOL = ("acctA", "acctB", "acctC", "acctD")


def _ingest(events: list[dict[str, Any]]) -> None:
    inbox_ingest(enumerate(events, start=1))


def _drain(**raw: Any) -> Any:
    return drain_run(options=drain_options("generic", raw), env={})


def _outcomes(report: Any) -> list[tuple[Any, ...]]:
    return [
        (
            r["event"]["id"],
            r["kind"],
            r.get("reason"),
            r.get("reasonCode"),
            tuple(sorted((r.get("accountProfiles") or {}).items())),
            bool(r.get("precheck")),
        )
        for r in report.results
    ]


scenarios = st.fixed_dictionaries(
    {
        "events": st.lists(
            st.tuples(
                st.sampled_from(["/p1", "/p2", "/p3", "/p4"]),
                st.sampled_from([None, "g1", "g2"]),
                st.sampled_from([None, "acctA,acctB", "acctC,acctD,acctA"]),
            ),
            min_size=1,
            max_size=30,
        ),
        "caps": st.fixed_dictionaries(
            {},
            optional={
                "max_active": st.integers(1, 25),
                "max_active_per_project": st.integers(1, 8),
                "max_active_per_project_group": st.integers(1, 10),
                "max_per_profile": st.integers(1, 6),
            },
        ),
        "pool": st.sampled_from([None, "acctA,acctB", ",".join(POOL)]),
        "cooling": st.sampled_from([(), ("acctA",), ("acctB", "acctC")]),
        "max_dispatch": st.integers(1, 40),
        "repeat": st.booleans(),
        # A last drain, and one of another scope that runs after its scan and before it
        # routes anything: the first meets rows it scanned already taken (or re-recorded).
        "interleave": st.one_of(st.none(), st.integers(1, 40)),
    }
)


def _run(scenario: dict[str, Any], batch_size: int, django_settings: Any) -> Any:
    django_settings.LOOPSWEB_DRAIN_BATCH_SIZE = batch_size
    rng = random.Random(len(scenario["events"]))
    events = []
    for n, (project, group, pool) in enumerate(scenario["events"]):
        event = generic_event(project=project, group=group)
        event["id"] = f"evt-{n}"
        if pool:
            event["data"]["auth_profile_pool"] = pool
        events.append(event)
    _ingest(events)
    until = timezone.now() + timezone.timedelta(hours=1)
    for account in scenario["cooling"]:
        AccountCooldown.objects.create(account_profile=account, until=until)
    raw: dict[str, Any] = dict(scenario["caps"], max_dispatch=scenario["max_dispatch"])
    if scenario["pool"]:
        raw["auth_profile_pool"] = scenario["pool"]
    reports = [_drain(**raw)]
    if scenario["repeat"]:  # a second drain meets the items and rows of the first
        rng.shuffle(events)
        reports.append(_drain(**raw))
    if scenario["interleave"] is not None:
        # One more drain, which another drain's run interleaves (after its scan).
        with pytest.MonkeyPatch.context() as patch:
            others: list[Any] = []
            _interleave(patch, dict(raw, max_dispatch=scenario["interleave"]), others)
            reports.append(_drain(**raw))
            reports += others
    return [_outcomes(r) for r in reports], drain_rows()


def _interleave(
    patch: pytest.MonkeyPatch, raw: dict[str, Any], reports: list[Any]
) -> None:
    """Run a drain of another scope once, right after the next drain's scan (when it loads
    the envelopes of its candidates, before it routes any), as a concurrent drain would."""
    from routing.drains import run

    real = run.load_envelopes
    done: list[bool] = []

    def other_drain_first(candidates: Any) -> Any:
        if not done:
            done.append(True)
            reports.append(_drain(**dict(raw, max_active_scope="other-drain")))
        return real(candidates)

    patch.setattr(run, "load_envelopes", other_drain_first)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios)
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_batched_admission_decides_exactly_as_one_at_a_time(
    scenario: dict[str, Any], settings: Any
) -> None:
    one = _run(scenario, 1, settings)
    assert_account_counts_match_rows()
    wipe_drain_rows()
    batched = _run(scenario, 50, settings)
    assert_account_counts_match_rows()
    wipe_drain_rows()
    assert batched == one


def test_a_batch_admits_in_few_statements(settings: Any) -> None:
    settings.LOOPSWEB_DRAIN_BATCH_SIZE = 50
    _ingest([generic_event(project=f"/srv/p{n % 5}") for n in range(50)])
    admission = _drain_fifty_counted()
    # The scan, the envelopes, the unlocked pre-check of the first candidate (counts,
    # loads) and the batch (lock, inbox rows, rows, counts, loads, bulk inserts, records):
    # far under one statement per admitted event.
    assert len(admission) <= 33, [q["sql"][:80] for q in admission]
    assert_account_counts_match_rows()


def _drain_fifty_counted() -> list[dict[str, str]]:
    """Drain the 50 ingested events with room for all, asserting all 50 were created; the
    drain's statements but the task queue's and the drain record's."""
    with CaptureQueriesContext(connection) as captured:
        report = _drain(
            max_active=1000,
            max_active_per_project=1000,
            auth_profile_pool="acctA,acctB,acctC",
            max_per_profile=1000,
            max_dispatch=50,
        )
    assert report.counts["created"] == 50
    return [
        q
        for q in captured.captured_queries
        if not q["sql"].startswith(
            (
                'INSERT INTO "django_q',
                'SELECT "routing_drain',
                # the drain record, written at the start and kept up as the drain goes
                # (drains.record_keeper): a few statements per drain, not per event
                'INSERT INTO "routing_drain',
                'UPDATE "routing_drain',
            )
        )
    ]


def test_events_whose_ids_share_eight_characters_are_admitted_in_the_batch(
    settings: Any,
) -> None:
    """A workflow name is unique per event (domain.keys.generic_names): ids that share
    their first 8 characters do not send admission down its one-at-a-time path (about 15
    statements an event, each archiving the previous spec of the same name)."""
    settings.LOOPSWEB_DRAIN_BATCH_SIZE = 50
    events = [generic_event(project=f"/srv/p{n % 5}") for n in range(50)]
    for n, event in enumerate(events):
        event["id"] = f"deploy-2026-12-07-{n}"
    _ingest(events)
    admission = _drain_fifty_counted()
    # As for ids of their own (the test above); 814 statements before names were unique.
    assert len(admission) <= 33, [q["sql"][:80] for q in admission]


def test_a_failed_batch_writes_nothing_and_the_drain_goes_on_one_at_a_time(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from routing.admission.batch import PendingRows

    settings.LOOPSWEB_DRAIN_BATCH_SIZE = 50
    _ingest([generic_event() for _ in range(5)])
    calls = {"n": 0}
    real = PendingRows.admit

    def fail_on_third(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            # The first two were decided; nothing of them may stay written.
            assert WorkflowWorkItem.objects.count() == 0
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(PendingRows, "admit", fail_on_third)
    report = _drain(max_active=10, max_dispatch=10)
    assert calls["n"] == 3  # after the failure, no batch again: one at a time
    assert report.counts["created"] == 5
    assert WorkflowWorkItem.objects.count() == 5 and WorkflowRun.objects.count() == 5
    assert set(InboxEvent.objects.values_list("state", "route_attempts")) == {
        ("admitted", 1)
    }
    assert_account_counts_match_rows()


def test_rows_another_drain_took_since_the_scan_are_left_to_it_without_a_rollback(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from routing.admission.batch import PendingRows
    from routing.drains import run

    settings.LOOPSWEB_DRAIN_BATCH_SIZE = 50
    _ingest([generic_event() for _ in range(3)])
    real = run.route_batch
    calls: list[int] = []
    decided_rows: list[int] = []

    def another_drain_first(pairs: Any, **kwargs: Any) -> Any:
        calls.append(len(pairs))
        if len(calls) == 1:
            # Another drain claims the second row after this one scanned it (committed
            # before this batch starts: its transaction only begins in route_batch).
            InboxEvent.objects.filter(pk=pairs[1][0].inbox_id).update(route_attempts=7)
        return real(pairs, **kwargs)

    real_fresh = PendingRows.admit

    def count_fresh(*args: Any, **kwargs: Any) -> Any:
        decided_rows.append(1)
        return real_fresh(*args, **kwargs)

    monkeypatch.setattr(run, "route_batch", another_drain_first)
    monkeypatch.setattr(PendingRows, "admit", count_fresh)
    report = _drain(max_active=10, max_dispatch=10)
    # One batch, never decided again: the lost row is dropped before any admission.
    assert calls == [3] and len(decided_rows) == 2
    # The row the other drain took is left to it (not written); the other two are admitted.
    assert report.counts["created"] == 2 and len(report.results) == 2
    assert WorkflowWorkItem.objects.count() == 2
    assert sorted(InboxEvent.objects.values_list("state", "route_attempts")) == [
        ("admitted", 1),
        ("admitted", 1),
        ("pending", 7),
    ]
    assert_account_counts_match_rows()


@pytest.mark.parametrize("batch_size", [1, 50])
def test_a_hold_already_recorded_is_reported_even_if_another_drain_rewrote_the_row(
    settings: Any, batch_size: int
) -> None:
    """One at a time decides the pre-check before it claims, and a hold the row records
    (as scanned) writes nothing, so it never learns another drain took the row meanwhile:
    it reports the hold. A batch owns its rows first but must report the same."""
    from routing.drains import run

    settings.LOOPSWEB_DRAIN_BATCH_SIZE = batch_size
    _ingest([generic_event(project="/srv/a"), generic_event(project="/srv/a")])
    caps = {"max_active": 10, "max_active_per_project": 1, "max_dispatch": 10}
    first = _drain(**caps)
    assert [r["kind"] for r in first.results] == ["created", "throttled"]
    held_id = first.results[1]["event"]["id"]
    held = InboxEvent.objects.get(event_id=held_id)
    real = run.load_envelopes

    def another_drain_rewrites_it(candidates: Any) -> Any:
        # After this drain's scan: another drain held the row for a reason of its own.
        InboxEvent.objects.filter(pk=held.pk).update(
            route_attempts=5, last_reason="another drain's reason", reason_code="x"
        )
        return real(candidates)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run, "load_envelopes", another_drain_rewrites_it)
        second = _drain(**caps)
    assert [(r["event"]["id"], r["kind"], r["reason"]) for r in second.results] == [
        (held_id, "throttled", held.last_reason)
    ]
    # Nothing written on the row: it keeps the other drain's outcome.
    assert InboxEvent.objects.filter(
        pk=held.pk, route_attempts=5, last_reason="another drain's reason"
    ).exists()


def test_a_batch_stops_where_max_dispatch_stops_one_at_a_time(settings: Any) -> None:
    """A batch takes more candidates than max_dispatch leaves to admit; those after the
    last admission stay untouched, ineligible ones included (one at a time never reaches
    them), and a later batch of the same drain reaches the ineligible one before them."""
    from tests.routing.helpers import todos_event

    outcomes = []
    for batch_size in (1, 50):
        settings.LOOPSWEB_DRAIN_BATCH_SIZE = batch_size
        events = [
            todos_event(project="/srv/a"),
            todos_event(tags=["auto:route", "manual"]),
            todos_event(project="/srv/b"),
            todos_event(tags=[]),
            todos_event(project="/srv/c"),
        ]
        _ingest(events)
        report = drain_run(
            options=drain_options("todos-task", {"max_dispatch": 2}), env={}
        )
        outcomes.append(
            (
                [(r["kind"], bool(r.get("precheck"))) for r in report.results],
                sorted(InboxEvent.objects.values_list("state", "route_attempts")),
            )
        )
        wipe_drain_rows()
    assert outcomes[0] == outcomes[1]
    # The drain stops at its second admission: the ineligible event before it is settled
    # as skipped, the one after it and the last eligible one stay pending, untouched.
    assert outcomes[1] == (
        [("created", False), ("skipped", False), ("created", False)],
        [
            ("admitted", 1),
            ("admitted", 1),
            ("pending", 0),
            ("pending", 0),
            ("skipped", 1),
        ],
    )


@pytest.mark.parametrize("batch_size", [1, 50])
def test_holds_decided_without_the_lock_leave_rows_another_drain_took(
    settings: Any, batch_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every candidate held: the same outcome as one at a time, a hold whose row another
    drain took since the scan dropped; a batch decides it without the admission lock."""
    from ledger import lock
    from routing.drains import inbox_batch, run

    settings.LOOPSWEB_DRAIN_BATCH_SIZE = batch_size
    caps = {"max_active": 10, "max_active_per_project": 1, "max_dispatch": 10}
    _ingest([generic_event(project="/srv/a"), generic_event(project="/srv/a")])
    _drain(**caps)  # admits the first, records the second's hold
    _ingest([generic_event(project="/srv/a"), generic_event(project="/srv/a")])
    taken = InboxEvent.objects.filter(state="pending").order_by("received_at").first()
    assert taken is not None
    real_load, real_lock = run.load_envelopes, lock.admission_lock
    locks: list[int] = []

    def another_drain_takes_one(candidates: Any) -> Any:
        InboxEvent.objects.filter(pk=taken.pk).update(route_attempts=5)
        return real_load(candidates)

    def counted_lock(*args: Any, **kwargs: Any) -> None:
        locks.append(1)
        real_lock(*args, **kwargs)

    monkeypatch.setattr(run, "load_envelopes", another_drain_takes_one)
    monkeypatch.setattr(run, "admission_lock", counted_lock)
    monkeypatch.setattr(inbox_batch, "admission_lock", counted_lock)
    report = _drain(**caps)
    assert [r["reasonCode"] for r in report.results] == ["project_cap", "project_cap"]
    assert taken.event_id not in {r["event"]["id"] for r in report.results}
    if batch_size > 1:
        assert locks == []
    assert sorted(InboxEvent.objects.values_list("state", "route_attempts")) == [
        ("admitted", 1),
        ("deferred", 1),
        ("deferred", 1),
        ("pending", 5),
    ]


@pytest.mark.parametrize("batch_size", [1, 50])
def test_a_pool_an_event_names_read_full_once_holds_its_other_candidates_unread(
    settings: Any, batch_size: int
) -> None:
    """Each event names its own pool: once the drain finds one pool full (both members
    cooling), the later candidates routed to that pool are held with the same reason
    without reading the pool again; a candidate of another pool is still admitted."""
    settings.LOOPSWEB_DRAIN_BATCH_SIZE = batch_size
    events = []
    for n in range(20):
        event = generic_event(project=f"/srv/p{n % 4}")
        event["data"]["auth_profile_pool"] = "acctA,acctB" if n != 7 else "acctC,acctD"
        events.append(event)
    _ingest(events)
    until = timezone.now() + timezone.timedelta(hours=1)
    for account in ("acctA", "acctB"):
        AccountCooldown.objects.create(account_profile=account, until=until)
    with CaptureQueriesContext(connection) as captured:
        report = _drain(max_active=100, max_dispatch=20)
    kinds = [r["kind"] for r in report.results]
    assert kinds.count("created") == 1 and kinds.count("throttled") == 19, kinds
    reasons = {r["reason"] for r in report.results if r["kind"] == "throttled"}
    assert len(reasons) == 1 and "cooling down" in next(iter(reasons)), reasons
    cooldown_reads = [
        q for q in captured.captured_queries if '"account_cooldowns"' in q["sql"]
    ]
    # The full pool once, and the pool of the one admitted event (its view, then its
    # admission): never once per held candidate.
    assert len(cooldown_reads) <= 4, [q["sql"][:120] for q in cooldown_reads]
