"""One pass per admitted event on the one-at-a-time path (issue 18): the lookup, the plan,
the lock, the inbox update and the cap counts each happen once; no savepoint where none is
needed; at most 14 statements per admitted event. Counted, not timed, on both databases,
with a connection execute wrapper (as the backlog benchmark counts: SQLite's `BEGIN
IMMEDIATE` included, COMMIT not, being no execute).

These tests commit (`transaction=True`): inside a test's own transaction every admission
would be a savepoint, and a savepoint is one of the things counted here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from ledger.models import WorkflowRun, WorkflowWorkItem
from routing.admission import CREATED, DEDUPED, route_event, route_options
from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from tests.account_loads import assert_account_counts_match_rows
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage
from tests.routing.helpers import todos_event

pytestmark = pytest.mark.django_db(transaction=True)

BOUND = 14  # statements per admitted event (the target)
CAPS: dict[str, Any] = {
    "max_active": 1000,
    "max_active_per_project": 1000,
    "auth_profile_pool": "acctA,acctB,acctC",
    "max_per_profile": 1000,
}


class _Log:
    """Every statement sent on the default connection, in order."""

    def __init__(self) -> None:
        self.sql: list[str] = []

    def __call__(
        self, execute: Any, sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        self.sql.append(sql)
        return execute(sql, params, many, context)


@contextmanager
def _logged() -> Iterator[_Log]:
    log = _Log()
    with connection.execute_wrapper(log):
        yield log


def _events(n: int, prefix: str) -> list[dict[str, Any]]:
    return [
        todos_event(f"{prefix}-{i}", project=f"/srv/one-pass/p{i % 4}")
        for i in range(n)
    ]


def _drain_per_event(n: int, *, dry_run: bool = False) -> tuple[Any, list[list[str]]]:
    """Drain `n` todos events one at a time; the statements of each event but the first
    (whose window also holds the drain's scan and set-up)."""
    options = drain_options(
        "todos-task",
        {**CAPS, "max_dispatch": n, "limit": n, "dry_run": dry_run},
    )
    marks: list[int] = []
    with _logged() as log:
        report = drain_run(
            options=options, env={}, progress=lambda r: marks.append(len(log.sql))
        )
    windows = [log.sql[a:b] for a, b in zip(marks, marks[1:], strict=False)]
    return report, windows


def _count(statements: list[str], *needles: str) -> int:
    return sum(1 for sql in statements if all(n in sql for n in needles))


def _reads(statements: list[str], *needles: str) -> int:
    return _count([s for s in statements if s.lstrip().startswith("SELECT")], *needles)


def _lookups(statements: list[str]) -> int:
    """Reads of a work item by its key (raw SQL or ORM); an INSERT names the column too."""
    return sum(
        1
        for sql in statements
        if sql.lstrip().startswith("SELECT")
        and '"workflow_work_items"' in sql
        and ("idempotency_key = %s" in sql or '"idempotency_key" = %s' in sql)
    )


def _assert_one_pass(statements: list[str]) -> None:
    """One admitted event's statements: each read and write once, nothing twice."""
    # One line per statement, so a failure shows every one (a list's repr is cut short).
    shown = "\n".join(" ".join(s.split())[:160] for s in statements)
    assert len(statements) <= BOUND, shown
    # The lock: PostgreSQL's advisory lock, or SQLite's BEGIN IMMEDIATE (the write lock).
    if connection.vendor == "postgresql":
        assert _count(statements, "pg_advisory_xact_lock") == 1, shown
    else:
        assert _count(statements, "BEGIN") == 1, shown
    assert _count(statements, "SAVEPOINT") == 0, shown
    # The lookup of the item (and of the rows to reuse) and the cap counts: one statement.
    assert _lookups(statements) == 1, shown
    assert _count(statements, "COUNT(*)") == 1, shown
    # The pool: loads, cooldowns and the members' registry rows in one read.
    assert _reads(statements, '"workflow_account_loads"') == 1, shown
    assert _reads(statements, '"accounts"') == 1, shown
    # The inbox row: claimed and recorded in one UPDATE.
    assert _count(statements, 'UPDATE "routing_inbox_events"') == 1, shown
    # The plan is made once, from the drain's one read of the registered providers.
    assert _count(statements, '"accounts"."provider"') == 0, shown


def test_a_one_at_a_time_drain_admits_each_event_in_one_pass(settings: Any) -> None:
    settings.LOOPSWEB_DRAIN_BATCH_SIZE = 1
    inbox_ingest(enumerate(_events(8, "drain")))
    report, windows = _drain_per_event(8)
    assert report.counts["created"] == 8 and len(windows) == 7
    for statements in windows:
        _assert_one_pass(statements)
    # ... and what it wrote is complete: every row admitted once, claimed once.
    assert set(InboxEvent.objects.values_list("state", "route_attempts")) == {
        ("admitted", 1)
    }
    assert WorkflowRun.objects.filter(status="queued").count() == 8
    assert_account_counts_match_rows()


def test_a_dry_run_drain_holds_one_savepoint_per_event() -> None:
    inbox_ingest(enumerate(_events(5, "dry")))
    report, windows = _drain_per_event(5, dry_run=True)
    assert report.counts["created"] == 5
    for statements in windows:
        shown = [" ".join(s.split())[:90] for s in statements]
        assert len(statements) <= BOUND + 2, shown  # + the savepoint and its release
        assert _count(statements, "SAVEPOINT") == 2, shown  # SAVEPOINT, RELEASE
        assert _count(statements, "RELEASE SAVEPOINT") == 1, shown
        assert _lookups(statements) == 1, shown
    assert not WorkflowWorkItem.objects.exists()
    assert set(InboxEvent.objects.values_list("state", flat=True)) == {"pending"}


def test_route_event_admits_in_one_pass_and_dedupes_from_the_same_lookup() -> None:
    options = route_options(CAPS)
    event = todos_event("api-1", project="/srv/one-pass/api")
    with _logged() as log:
        first = route_event(kind="todos-task", envelope=event, options=options, env={})
    assert first.kind == CREATED
    shown = [" ".join(s.split())[:90] for s in log.sql]
    # The plan's one read of the registered providers, then the one-pass admission.
    assert _count(log.sql, '"accounts"."provider"') == 1, shown
    assert len(log.sql) <= BOUND, shown
    assert _lookups(log.sql) == 1, shown
    assert _count(log.sql, "COUNT(*)") == 1 and _count(log.sql, "SAVEPOINT") == 0

    # Upstream's early dedupe, now from the admission's own lookup: nothing written.
    again = {**event, "id": "evt-api-1-again"}
    with _logged() as log:
        second = route_event(kind="todos-task", envelope=again, options=options, env={})
    assert second.kind == DEDUPED
    assert second.work_item is not None and second.work_item.pk == first.work_item.pk
    assert second.invocation is not None
    assert second.invocation.pk == second.work_item.invocation_id
    assert not [s for s in log.sql if s.lstrip().startswith(("INSERT", "UPDATE"))]
    assert _lookups(log.sql) == 1
    assert WorkflowRun.objects.count() == 1


@pytest.mark.slow
def test_the_drain_command_one_at_a_time_admits_and_dedupes_every_event_once() -> None:
    """`manage.py drain` in its own process, batches of one, on the test database."""
    inbox_ingest(enumerate(_events(6, "cmd")))
    env = {
        **os.environ,
        "DATABASE_URL": child_database_url(),
        "LOOPSWEB_DRAIN_BATCH_SIZE": "1",
    }
    args = [
        "drain",
        "todos-task",
        "--json",
        "--max-dispatch",
        "10",
        "--max-active",
        "1000",
        "--auth-profile-pool",
        "acctA,acctB,acctC",
        "--max-per-profile",
        "1000",
    ]

    def drain() -> dict[str, Any]:
        return json.loads(manage(env, *args).stdout)

    report = drain()
    assert report["created"] == 6, report
    assert set(InboxEvent.objects.values_list("state", "route_attempts")) == {
        ("admitted", 1)
    }
    assert WorkflowRun.objects.filter(status="queued").count() == 6
    assert_account_counts_match_rows()
    # The same tasks delivered again: deduped by the admission's one lookup, nothing new.
    inbox_ingest(enumerate({**e, "id": e["id"] + "-again"} for e in _events(6, "cmd")))
    again = drain()
    assert again["created"] == 0 and again["deduped"] == 6, again
    assert WorkflowRun.objects.count() == 6
    assert InboxEvent.objects.filter(state="admitted").count() == 12
