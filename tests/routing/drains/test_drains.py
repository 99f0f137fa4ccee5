"""Drains over the inbox and a source command (issue 4)."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import WorkflowRun, WorkflowStepRun, WorkflowWorkItem
from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import DrainRecord, InboxEvent
from tests.account_loads import release_run_load
from tests.routing.api.helpers import row_counts
from tests.routing.helpers import generic_event, todos_event
from tests.waiting import hang_deadline, wait_for

pytestmark = pytest.mark.django_db


def ingest(*events: dict) -> None:
    inbox_ingest(enumerate(events, start=1))


def drain(kind: str = "generic", **raw):
    return drain_run(options=drain_options(kind, raw), env={})


def finish(item_id: str) -> None:
    item = WorkflowWorkItem.objects.get(pk=item_id)
    release_run_load(item.workflow_run_id)
    WorkflowStepRun.objects.filter(workflow_run_id=item.workflow_run_id).update(
        status="succeeded"
    )
    WorkflowRun.objects.filter(pk=item.workflow_run_id).update(status="succeeded")
    WorkflowWorkItem.objects.filter(pk=item_id).update(status="succeeded")


def test_max_dispatch_counts_only_created_results() -> None:
    ingest(*(generic_event() for _ in range(5)))
    report = drain(max_dispatch=2)
    assert report.counts["created"] == 2 and report.counts["considered"] == 2
    assert InboxEvent.objects.filter(state="admitted").count() == 2
    assert InboxEvent.objects.filter(state="pending").count() == 3
    record = DrainRecord.objects.get()
    assert (record.created, record.considered, record.scanned) == (2, 2, 5)
    assert [r["kind"] for r in record.results_json] == ["created", "created"]


def test_deduped_and_throttled_items_do_not_count_toward_max_dispatch() -> None:
    ingest(todos_event("t1", project="/srv/a", project_group="g"))
    drain("todos-task")
    # A redelivery of t1 (another event id) dedupes; group g is full; /b has no group.
    duplicate = todos_event("t1", project="/srv/a", project_group="g")
    duplicate["id"] = "evt-t1-again"
    ingest(
        duplicate,
        todos_event("t2", project="/srv/c", project_group="g"),
        todos_event("t3", project="/srv/b"),
    )
    report = drain("todos-task", max_dispatch=1, max_active_per_project_group=1)
    assert [(r["kind"], r.get("taskId")) for r in report.results] == [
        ("deduped", "t1"),
        ("throttled", "t2"),
        ("created", "t3"),
    ]


def test_fair_dispatch_takes_one_from_each_project_before_a_deep_backlog() -> None:
    ingest(*(generic_event(project="/srv/deep") for _ in range(10)))
    ingest(generic_event(project="/srv/p2"), generic_event(project="/srv/p3"))
    report = drain(max_dispatch=3)
    projects = sorted(WorkflowWorkItem.objects.values_list("project_key", flat=True))
    assert report.counts["created"] == 3 and projects == [
        "/srv/deep",
        "/srv/p2",
        "/srv/p3",
    ]


def test_saturated_projects_are_skipped_before_spending_admissions() -> None:
    ingest(
        generic_event(project="/srv/busy"),
        generic_event(project="/srv/busy"),
        generic_event(project="/srv/free"),
    )
    report = drain(max_dispatch=5, max_active_per_project=1)
    by_kind = [(r["kind"], r.get("precheck")) for r in report.results]
    assert by_kind.count(("created", None)) == 2 and ("throttled", True) in by_kind
    held = InboxEvent.objects.get(state="deferred")
    assert held.reason_code == "project_cap" and held.last_reason.startswith(
        "project active workflow limit"
    )


def test_a_deferred_item_is_admitted_by_a_later_drain_once_a_run_finishes() -> None:
    ingest(generic_event(), generic_event())
    first = drain(max_dispatch=5, max_active=1)
    assert first.counts["created"] == 1 and first.counts["throttled"] == 1
    waiting = InboxEvent.objects.get(state="deferred")
    assert drain(max_dispatch=5, max_active=1).counts["created"] == 0
    finish(first.results[0]["workItem"]["id"])
    later = drain(max_dispatch=5, max_active=1)
    assert later.counts["created"] == 1
    waiting.refresh_from_db()
    assert waiting.state == "admitted" and waiting.work_item.status == "admitted"


def test_a_dry_run_changes_no_row_and_reports_the_decisions_a_real_drain_then_makes() -> (
    None
):
    ingest(*(generic_event(project=f"/srv/p{i % 2}") for i in range(6)))
    options = {
        "max_dispatch": 4,
        "max_active_per_project": 1,
        "auth_profile_pool": "a,b,c",
    }
    before = row_counts()
    preview = drain(dry_run=True, **options)
    assert row_counts() == before
    real = drain(**options)

    def summary(report):
        return [
            (r["kind"], r.get("reasonCode"), r.get("accountProfiles"))
            for r in report.results
        ]

    assert summary(preview) == summary(real)
    assert preview.counts == real.counts and real.counts["created"] == 2


def test_evidence_files_are_private_complete_and_never_overwritten(
    tmp_path: Path,
) -> None:
    ingest(generic_event())
    evidence = tmp_path / "evidence"
    first = drain(evidence_dir=str(evidence))
    second = drain(evidence_dir=str(evidence))
    assert first.evidence_path != second.evidence_path
    assert stat.S_IMODE(evidence.stat().st_mode) == 0o700
    path = Path(first.evidence_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.name.startswith("generic-event-drain-") and path.suffix == ".json"
    body = json.loads(path.read_text())
    assert (
        body["created"] == 1 and body["results"][0]["workItem"]["status"] == "admitted"
    )
    assert body["evidencePath"] == str(path)
    assert DrainRecord.objects.filter(evidence_path=str(path)).exists()


def test_the_drain_command_exits_non_zero_when_an_item_is_fatal(tmp_path: Path) -> None:
    ingest(
        todos_event("ok"),
        {"id": "bad", "type": "task.created", "source": "x", "data": {}},
    )
    with pytest.raises(
        CommandError, match="route drain hit 1 non-skippable task error"
    ):
        call_command("drain", "todos-task", "--max-dispatch", "5", stdout=io.StringIO())
    record = DrainRecord.objects.get()
    assert record.fatal == 1 and record.created == 1
    assert InboxEvent.objects.get(event_id="bad").state == "failed"


def test_the_drain_command_prints_compact_json() -> None:
    ingest(generic_event())
    out = io.StringIO()
    call_command(
        "drain",
        "generic",
        "--json",
        "--compact",
        "--auth-profile-pool",
        "a,b",
        stdout=out,
    )
    report = json.loads(out.getvalue())
    result = report["results"][0]
    assert set(result) >= {
        "kind",
        "eventId",
        "idempotencyKey",
        "workItemId",
        "workItemStatus",
        "accountProfiles",
        "routeScope",
    }
    assert report["created"] == 1 and report["routeScope"] == "generic-event"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-dispatch", "0"], "--max-dispatch must be a positive integer"),
        (["--limit", "-3"], "--limit must be a positive integer"),
        (["--source", "ftp"], "--source must be inbox or command"),
        (["--source", "command"], "--source command needs --source-command"),
    ],
)
def test_bad_drain_options_are_refused_before_anything_runs(args, message) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("drain", "generic", *args, stdout=io.StringIO())
    assert DrainRecord.objects.count() == 0


def _source_script(tmp_path: Path, body: str) -> str:
    script = tmp_path / "todos.py"
    script.write_text(body)
    return f"{sys.executable} {script}"


@pytest.mark.slow
def test_a_source_command_supplies_tasks_in_the_todos_ready_shape(
    tmp_path: Path,
) -> None:
    tasks = [
        {
            "id": "tk-1",
            "title": "one",
            "tags": ["auto:route", "fast"],
            "project_path": "/srv/x",
        },
        {
            "id": "tk-2",
            "title": "two",
            "tags": ["auto:route"],
            "project_path": "/srv/x",
        },
        {
            "id": "tk-3",
            "title": "manual",
            "tags": ["auto:route", "manual", "fast"],
            "project_path": "/srv/x",
        },
    ]
    command = _source_script(tmp_path, f"import json; print(json.dumps({tasks!r}))")
    report = drain(
        "todos-task",
        source="command",
        source_command=command,
        tags="fast",
        max_dispatch=5,
    )
    assert report.scanned == 3 and report.candidates == 2
    assert [(r["kind"], r.get("taskId")) for r in report.results] == [
        ("created", "tk-1"),
        ("skipped", "tk-3"),
    ]
    assert WorkflowWorkItem.objects.get().idempotency_key == "todos-task:tk-1"


@pytest.mark.slow
def test_a_hanging_or_flooding_source_command_fails_the_drain_cleanly(
    tmp_path: Path, settings
) -> None:
    slow = _source_script(tmp_path, "import time; time.sleep(30)")
    report = drain(
        "todos-task", source="command", source_command=slow, source_timeout=1
    )
    assert "timed out" in report.error and report.fatal == 1
    settings.LOOPSWEB_SOURCE_MAX_BYTES = 2048
    flood = _source_script(tmp_path, "print('[' + ','.join(['1'] * 5000) + ']')")
    assert (
        "more than 2048 bytes"
        in drain("todos-task", source="command", source_command=flood).error
    )


def test_a_schedule_runs_a_drain_when_the_scheduler_fires_with_its_name_as_scope(
    monkeypatch,
) -> None:
    from django_q.brokers import get_broker
    from django_q.conf import Conf
    from django_q.models import Schedule
    from django_q.scheduler import scheduler

    monkeypatch.setattr(Conf, "SYNC", True)
    ingest(generic_event(), generic_event())
    call_command(
        "schedule_drain",
        "nightly-ci",
        "generic",
        "--every",
        "5m",
        "--max-active",
        "1",
        "--max-dispatch",
        "5",
        stdout=io.StringIO(),
    )
    # Due a moment ago (django-q2 steps next_run forward interval by interval, so not years).
    Schedule.objects.filter(name="nightly-ci").update(
        next_run=timezone.now() - timedelta(seconds=1)
    )
    scheduler(broker=get_broker())
    record = DrainRecord.objects.get()
    assert (
        record.name == "nightly-ci"
        and record.route_scope == "nightly-ci"
        and record.created == 1
    )
    assert WorkflowWorkItem.objects.get(status="admitted").route_scope == "nightly-ci"
    held = InboxEvent.objects.get(state="deferred")
    assert held.reason_code == "route_cap" and held.last_reason.startswith(
        "scope nightly-ci active workflow"
    )


def test_schedule_drain_lists_updates_and_deletes() -> None:
    call_command(
        "schedule_drain", "a", "generic", "--cron", "*/5 * * * *", stdout=io.StringIO()
    )
    call_command(
        "schedule_drain", "a", "generic", "--every", "2h", stdout=io.StringIO()
    )
    out = io.StringIO()
    call_command("schedule_drain", "--list", "--json", stdout=out)
    [row] = json.loads(out.getvalue())
    assert row["name"] == "a" and row["every"] == "120m" and row["cron"] is None
    with pytest.raises(CommandError, match="not a valid cron"):
        call_command(
            "schedule_drain", "b", "generic", "--cron", "nope", stdout=io.StringIO()
        )
    call_command("schedule_drain", "--delete", "a", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no scheduled drain"):
        call_command("schedule_drain", "--delete", "a", stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_two_drains_at_once_admit_nothing_twice() -> None:
    ingest(*(generic_event(project=f"/srv/p{i}") for i in range(12)))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            drain(max_dispatch=50)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert WorkflowWorkItem.objects.count() == 12 and WorkflowRun.objects.count() == 12
    assert sum(DrainRecord.objects.values_list("created", flat=True)) == 12
    assert os.environ.get("LOOPS_LOOP_NAME") is None


def test_a_drain_skips_an_inbox_row_another_drain_claimed_after_the_scan() -> None:
    from routing.drains.outcomes import inbox_claim
    from routing.drains.sources import scan_inbox

    ingest(generic_event())
    (candidate,) = scan_inbox(route_key="generic-event", scan_limit=10)
    (stale,) = scan_inbox(route_key="generic-event", scan_limit=10)
    assert inbox_claim(candidate) is True
    assert inbox_claim(stale) is False  # the other drain's scan is now out of date
    assert InboxEvent.objects.get().route_attempts == 1


# --- what a drain reads and writes (cheap when full, one drain per scope) ---------------------


def _inbox_updates(captured: CaptureQueriesContext) -> int:
    return sum(
        1
        for q in captured.captured_queries
        if q["sql"].startswith('UPDATE "routing_inbox_events"')
    )


def test_a_drain_whose_scope_is_full_scans_nothing_and_says_why() -> None:
    ingest(generic_event(), generic_event())
    assert drain(max_active=1, max_dispatch=5).counts["created"] == 1
    waiting = InboxEvent.objects.get(state="deferred")
    before = (waiting.updated_at, waiting.route_attempts)

    report = drain(max_active=1)
    assert report.scanned == 0 and report.counts["considered"] == 0
    assert (
        report.held_reason == "scope generic-event active workflow limit reached (1/1)"
    )
    assert f"(held: {report.held_reason})" in report.human()
    assert report.to_dict(compact=True)["heldReason"] == report.held_reason
    record = DrainRecord.objects.get(pk=report.record_id)
    assert record.held_reason == report.held_reason and record.scanned == 0
    waiting.refresh_from_db()
    assert (
        waiting.updated_at,
        waiting.route_attempts,
    ) == before  # not read, not written


def test_once_the_scope_fills_the_rest_are_held_unread_with_one_update() -> None:
    updates = []
    for n in (3, 12):
        InboxEvent.objects.all().delete()
        WorkflowWorkItem.objects.update(status="succeeded")  # free the scope
        ingest(*(generic_event(project=f"/srv/p{i}") for i in range(n)))
        with CaptureQueriesContext(connection) as captured:
            report = drain(max_active=1, max_dispatch=5)
        kinds = [(r["kind"], r.get("reasonCode")) for r in report.results]
        assert kinds[0] == ("created", None)
        assert kinds[1:] == [("throttled", "route_cap")] * (n - 1)
        assert report.held_reason and all(r["precheck"] for r in report.results[1:])
        states = InboxEvent.objects.values_list("state", "reason_code")
        assert sorted(states) == [("admitted", None)] + [("deferred", "route_cap")] * (
            n - 1
        )
        updates.append(_inbox_updates(captured))
    # one batch records the admitted row and the first hold (one UPDATE each, the claim
    # included), then one UPDATE for all the rest: the same for 3 events and for 12
    assert updates[0] == updates[1] == 3


def test_a_hold_the_row_already_records_writes_nothing() -> None:
    ingest(generic_event(project="/srv/busy"))
    drain(max_active_per_project=1)
    ingest(generic_event(project="/srv/busy"))
    first = drain(max_active_per_project=1)
    assert [r["reasonCode"] for r in first.results] == ["project_cap"]
    held = InboxEvent.objects.get(state="deferred")
    with CaptureQueriesContext(connection) as captured:
        again = drain(max_active_per_project=1)
    assert [r["reasonCode"] for r in again.results] == ["project_cap"]
    assert _inbox_updates(captured) == 0
    assert InboxEvent.objects.get(pk=held.pk).updated_at == held.updated_at


def test_a_full_project_holds_its_later_candidates_without_another_count() -> None:
    ingest(generic_event(project="/srv/busy"))
    drain(max_active_per_project=1)
    ingest(*(generic_event(project="/srv/busy") for _ in range(4)))
    with CaptureQueriesContext(connection) as captured:
        report = drain(max_active_per_project=1, max_dispatch=5)
    assert [r["reasonCode"] for r in report.results] == ["project_cap"] * 4
    counts = [
        q
        for q in captured.captured_queries
        if "COUNT(*)" in q["sql"] and '"workflow_work_items"' in q["sql"]
    ]
    # One: the first candidate's pre-check (no --max-active, so no scope check at start).
    assert len(counts) == 1


def test_an_ineligible_event_leaves_the_inbox_as_skipped() -> None:
    ingest(todos_event(tags=[]))
    report = drain("todos-task")
    assert [r["kind"] for r in report.results] == ["skipped"]
    row = InboxEvent.objects.get()
    assert row.state == "skipped" and row.last_reason == "missing explicit route opt-in"
    assert drain("todos-task").scanned == 0  # not scanned again


@pytest.mark.parametrize("dry_run", [True, False])
def test_events_that_can_never_route_are_reported_skipped_not_held(
    dry_run: bool,
) -> None:
    # The scope fills with the first event; the later ones that never route (no opt-in, a
    # manual task) must say why they never run, not that a cap holds them (issue 19).
    no_opt_in, manual = todos_event(tags=[]), todos_event(tags=["auto:route", "manual"])
    ingest(
        todos_event(project="/srv/a"), todos_event(project="/srv/b"), no_opt_in, manual
    )
    report = drain("todos-task", max_active=1, max_dispatch=5, dry_run=dry_run)
    kinds = {r["event"]["id"]: (r["kind"], r.get("reasonCode")) for r in report.results}
    assert kinds[no_opt_in["id"]][0] == "skipped"
    assert kinds[manual["id"]][0] == "skipped"
    assert sorted(kinds.values()) == sorted(
        [
            ("created", None),
            ("throttled", "route_cap"),
            ("skipped", None),
            ("skipped", None),
        ]
    )
    states = dict(InboxEvent.objects.values_list("event_id", "state"))
    if dry_run:
        assert set(states.values()) == {"pending"}
    else:
        assert states[no_opt_in["id"]] == states[manual["id"]] == "skipped"


@pytest.mark.django_db(transaction=True)
def test_a_second_drain_of_a_running_scope_steps_aside_and_writes_nothing() -> None:
    from ledger.lock import drain_lock

    ingest(generic_event(), generic_event())
    holding, release = threading.Event(), threading.Event()

    def other_drain() -> None:  # holds the scope's drain lock from another connection
        try:
            with drain_lock("generic-event", "generic-event") as ours:
                assert ours
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=other_drain)
    thread.start()
    try:
        assert holding.wait(10)
        before = row_counts()
        report = drain(max_dispatch=5)
        assert report.overlapped and report.record_id is None
        assert report.counts["considered"] == 0 and row_counts() == before
        assert "overlap skip" in report.human()
        assert report.to_dict(compact=True)["overlapSkipped"] is True
        from routing.tasks import drain as drain_task  # the scheduled drain says so too

        assert drain_task("generic", {"max_dispatch": 5})["overlapSkipped"] is True
        # Another scope is another drain.
        assert drain(max_dispatch=1, max_active_scope="other").counts["created"] == 1
        assert drain(max_dispatch=5, dry_run=True).overlapped is False  # reads only
    finally:
        release.set()
        thread.join()
    assert drain(max_dispatch=5).counts["created"] == 1  # the lock is free again


def test_the_inbox_scan_is_light_and_envelopes_load_in_one_query() -> None:
    from routing.drains.sources import load_envelopes, scan_inbox

    ingest(*(generic_event(project=f"/srv/p{i}", title=f"t{i}") for i in range(3)))
    scanned = list(scan_inbox(route_key="generic-event", scan_limit=10))
    assert [c.envelope for c in scanned] == [None, None, None]
    assert [c.project for c in scanned] == ["/srv/p0", "/srv/p1", "/srv/p2"]
    InboxEvent.objects.filter(pk=scanned[1].inbox_id).delete()
    with CaptureQueriesContext(connection) as captured:
        loaded = load_envelopes(list(reversed(scanned)))
    assert len(captured) == 1
    assert [c.envelope.data["title"] for c in loaded] == ["t2", "t0"]  # order kept
    tagged = list(scan_inbox(route_key="generic-event", scan_limit=10, with_tags=True))
    assert [c.envelope for c in tagged] == [None, None]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_drain_and_an_operator_requeue_of_the_same_item_do_not_deadlock(
    monkeypatch, settings
) -> None:
    """The drain and the requeue both write the item and its inbox rows. Both take the
    admission lock first, so on PostgreSQL they queue instead of deadlocking (without it on
    the requeue side, this deadlocked). One at a time, so the slowed `admit` is the drain's.

    The threads are made to overlap: the drain, inside its transaction and holding the lock,
    waits until the requeue is seen waiting for that lock (PostgreSQL: its advisory lock
    request not granted; SQLite: its BEGIN IMMEDIATE, the database write lock), and the
    requeue gets the lock only after the drain's admission returned."""
    import sys

    settings.LOOPSWEB_DRAIN_BATCH_SIZE = 1

    from ledger.lock import ADMISSION_KEY, ADVISORY_NAMESPACE
    from ledger.services import work_item_requeue
    from ledger.services import work_items as work_items_module
    from routing.drains import run as drains

    ingest(todos_event("t1"))
    assert drain("todos-task").counts["created"] == 1
    item = WorkflowWorkItem.objects.get()
    long_ago = timezone.now() - timedelta(days=3)  # past the re-admission backoff
    WorkflowWorkItem.objects.filter(pk=item.pk).update(
        status="failed", updated_at=long_ago
    )
    again = todos_event("t1")
    again["id"] = "evt-t1-again"
    ingest(again)
    InboxEvent.objects.filter(event_id="evt-t1-again").update(
        state="deferred", work_item=item, reason_code="route_cap", last_reason="held"
    )
    hang = hang_deadline()  # only a hang takes this long
    order: list[str] = []
    order_lock = threading.Lock()

    def happened(what: str) -> None:
        with order_lock:
            order.append(what)

    drain_holds_lock = threading.Event()
    requeue_seen_waiting = threading.Event()
    real_admit = drains.admit
    real_lock = work_items_module.admission_lock

    def held_admit(*args, **kwargs):
        # Inside the drain's transaction, after its admission_lock().
        if drain_holds_lock.is_set():  # only the first admission waits
            return real_admit(*args, **kwargs)
        happened("drain holds the lock")
        drain_holds_lock.set()
        assert requeue_seen_waiting.wait(hang), "the requeue never waited for the lock"
        result = real_admit(*args, **kwargs)
        happened("drain admitted")
        return result

    def requeue_lock(*args, **kwargs):
        real_lock(*args, **kwargs)
        happened("requeue got the lock")

    monkeypatch.setattr(drains, "admit", held_admit)
    monkeypatch.setattr(work_items_module, "admission_lock", requeue_lock)
    outcome: dict[str, object] = {}

    def run(name: str, call) -> None:
        try:
            outcome[name] = call()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            outcome[name] = exc
        finally:
            connection.close()

    def requeue() -> object:
        assert drain_holds_lock.wait(hang), "the drain never reached its admission"
        return work_item_requeue(item_id=item.pk, reason="operator requeue")

    drainer = threading.Thread(target=run, args=("drain", lambda: drain("todos-task")))
    requeuer = threading.Thread(target=run, args=("requeue", requeue))
    drainer.start()
    requeuer.start()

    def requeue_waits_for_the_lock() -> bool:
        frame = sys._current_frames().get(requeuer.ident or -1)
        names = set()
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        if connection.vendor == "postgresql":
            if "requeue_lock" not in names:
                return False
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND NOT granted AND classid = %s AND objid = %s AND database ="
                    " (SELECT oid FROM pg_database WHERE datname = current_database())",
                    [ADVISORY_NAMESPACE, ADMISSION_KEY],
                )
                return bool(cursor.fetchone()[0])
        # SQLite: the admission lock is the write lock BEGIN IMMEDIATE takes.
        return "_start_transaction_under_autocommit" in names and (
            "work_item_requeue" in names
        )

    def requeue_waits() -> bool:
        assert requeuer.is_alive(), outcome.get("requeue")
        return requeue_waits_for_the_lock()

    wait_for(requeue_waits, interval=0.05, what="the requeue waiting for the lock")
    happened("requeue waits for the lock")
    requeue_seen_waiting.set()
    for thread in (drainer, requeuer):
        thread.join(hang)
        assert not thread.is_alive(), "deadlocked"
    from ledger.services import LedgerError

    assert order == [
        "drain holds the lock",
        "requeue waits for the lock",
        "drain admitted",
        "requeue got the lock",
    ], order
    assert not isinstance(outcome["drain"], BaseException), outcome["drain"]
    assert outcome["drain"].counts["fatal"] == 0
    # The requeue saw the drain's result: a requeue refused because the drain re-admitted
    # the item is an answer, not a failure; a database error would be one.
    requeued = outcome["requeue"]
    assert not isinstance(requeued, BaseException) or (
        isinstance(requeued, LedgerError) and "not requeueable" in str(requeued)
    ), requeued
    assert not InboxEvent.objects.filter(state="failed").exists()


def test_a_failure_never_overwrites_what_another_drain_recorded() -> None:
    from routing.drains.outcomes import inbox_claim, record_failure
    from routing.drains.sources import scan_inbox

    ingest(generic_event())
    (stale,) = scan_inbox(route_key="generic-event", scan_limit=10)
    (other,) = scan_inbox(route_key="generic-event", scan_limit=10)
    assert inbox_claim(other, state="deferred", last_reason="held by the other drain")
    now = timezone.now()
    record_failure(stale, {"kind": "skipped", "fatal": True, "reason": "boom"}, now)
    row = InboxEvent.objects.get()
    assert (row.state, row.last_reason) == ("deferred", "held by the other drain")
    (fresh,) = scan_inbox(route_key="generic-event", scan_limit=10)
    record_failure(fresh, {"kind": "skipped", "fatal": True, "reason": "boom"}, now)
    assert InboxEvent.objects.get().state == "failed"  # its own scan: recorded


def test_a_passing_database_error_leaves_the_row_open(monkeypatch, settings) -> None:
    from django.db import OperationalError

    from routing.drains import run as drains

    settings.LOOPSWEB_DRAIN_BATCH_SIZE = 1  # one at a time: `admit` is the admission

    def locked(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(drains, "admit", locked)
    ingest(generic_event())
    report = drain()
    (result,) = report.results
    assert result["fatal"] and result["reason"].endswith(
        "(left open for a later drain)"
    )
    row = InboxEvent.objects.get()
    assert row.state == "pending" and row.route_attempts == 0
