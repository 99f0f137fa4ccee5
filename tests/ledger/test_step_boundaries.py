"""One transaction per step boundary (issue 18): a step's finish and the next step's start,
or the run's end, are written together (`services.step_complete`), with the events of a
transaction in one statement (`events_in_one_statement`) and the account read in one
(`account_gate`). On both databases."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger import services
from ledger.models import (
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkItemStatus,
)
from ledger.selectors import account_gate
from ledger.services.common import append_event, events_in_one_statement
from runs.runner import run_workflow_run
from tests.account_loads import assert_account_counts_match_rows
from tests.ledger.runner_helpers import (
    FakeAgent,
    admit_workflow,
    agent_step,
    event_types,
    steps_of,
)

pytestmark = pytest.mark.django_db

OK = services.StepResult(status=StepStatus.SUCCEEDED, exit_code=0, duration_ms=5)


def _two_steps(tmp_path: Path, worker: str = "acctA", verifier: str = "acctB") -> Any:
    return admit_workflow(
        [
            agent_step("worker", cwd=tmp_path, profile=worker),
            agent_step(
                "verifier",
                cwd=tmp_path,
                profile=verifier,
                depends_on=["worker"],
                max_per_profile=1,
            ),
        ]
    )


def _started(run: WorkflowRun, worker: str = "w:1") -> Any:
    services.run_claim(run_id=run.id, worker=worker)
    first = steps_of(run)["worker"]
    assert services.step_start(step_run_id=first.id, worker=worker).started
    return first


def test_finishing_a_step_starts_the_next_in_the_same_transaction(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = _two_steps(tmp_path)
    first = _started(run)
    second = steps_of(run)["verifier"]

    outcome = services.step_complete(
        step_run_id=first.id, worker="w:1", result=OK, start_next=second.id
    )

    assert outcome is not None and outcome.started
    steps = steps_of(run)
    assert steps["worker"].status == StepStatus.SUCCEEDED
    assert steps["worker"].exit_code == 0 and steps["worker"].duration_ms == 5
    assert steps["verifier"].status == StepStatus.RUNNING
    assert [e[1:] for e in event_types(run)][-2:] == [
        ("step_succeeded", "worker"),
        ("step_started", "verifier"),
    ]
    sequences = [e[0] for e in event_types(run)]
    assert sequences == list(range(1, len(sequences) + 1))
    assert_account_counts_match_rows()


def test_a_refused_next_start_keeps_the_finish_and_leaves_the_step_waiting(
    agent: FakeAgent, tmp_path: Path
) -> None:
    # acctB carries one running step elsewhere; the verifier allows one per account.
    busy = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctB")])
    busy_step = _started(busy, worker="w:busy")
    run = _two_steps(tmp_path)
    first = _started(run)
    second = steps_of(run)["verifier"]

    outcome = services.step_complete(
        step_run_id=first.id, worker="w:1", result=OK, start_next=second.id
    )

    assert outcome is not None and not outcome.started
    assert outcome.wait_code == "profile_cap"
    steps = steps_of(run)
    assert steps["worker"].status == StepStatus.SUCCEEDED
    assert steps["verifier"].status == StepStatus.PENDING
    assert [e[1:] for e in event_types(run)][-2:] == [
        ("step_succeeded", "worker"),
        ("step_waiting", "verifier"),
    ]
    assert_account_counts_match_rows()
    # The slot frees: the waiting step starts on its own.
    services.step_finish(step_run_id=busy_step.id, status=StepStatus.SUCCEEDED)
    assert services.step_start(step_run_id=second.id, worker="w:1").started
    assert_account_counts_match_rows()


def test_the_last_step_and_the_run_end_together_and_cascade(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    first = _started(run)

    services.step_complete(
        step_run_id=first.id,
        worker="w:1",
        result=OK,
        end=services.RunEnd(status=RunStatus.SUCCEEDED),
    )

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.lease_expires_at is None
    assert run.work_item.status == WorkItemStatus.SUCCEEDED
    # The generated one-shot spec is archived in the same transaction.
    assert [e[1:] for e in event_types(run)][-3:] == [
        ("step_succeeded", "worker"),
        ("succeeded", None),
        ("workflow_archived", None),
    ]
    assert_account_counts_match_rows()


def test_a_failed_step_skips_the_rest_with_its_reason_and_fails_the_run(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = _two_steps(tmp_path)
    first = _started(run)
    failed = services.StepResult(
        status=StepStatus.FAILED, exit_code=3, error="step exited with code 3"
    )

    services.step_complete(
        step_run_id=first.id,
        worker="w:1",
        result=failed,
        end=services.RunEnd(
            status=RunStatus.FAILED,
            error="step worker failed: step exited with code 3",
            skip_reason="not run: step worker failed",
        ),
    )

    run.refresh_from_db()
    steps = steps_of(run)
    assert run.status == RunStatus.FAILED
    assert run.error == "step worker failed: step exited with code 3"
    assert steps["verifier"].status == StepStatus.SKIPPED
    assert steps["verifier"].error == "not run: step worker failed"
    assert run.work_item.status == WorkItemStatus.FAILED
    assert [e[1:] for e in event_types(run)][-4:] == [
        ("step_failed", "worker"),
        ("step_skipped", "verifier"),
        ("failed", None),
        ("workflow_archived", None),
    ]
    assert_account_counts_match_rows()


def test_a_boundary_for_a_run_that_is_no_longer_ours_writes_nothing(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = _two_steps(tmp_path)
    first = _started(run)
    second = steps_of(run)["verifier"]
    events_before = event_types(run)

    with pytest.raises(services.LedgerError, match="workflow step is not running"):
        services.step_complete(
            step_run_id=first.id, worker="w:other", result=OK, start_next=second.id
        )

    steps = steps_of(run)
    assert steps["worker"].status == StepStatus.RUNNING
    assert steps["verifier"].status == StepStatus.PENDING
    assert event_types(run) == events_before
    assert_account_counts_match_rows()


def test_events_held_for_one_statement_keep_their_order_per_run_and_vanish_on_error(
    tmp_path: Path,
) -> None:
    one = admit_workflow([agent_step("worker", cwd=tmp_path)])
    two = admit_workflow([agent_step("worker", cwd=tmp_path)])
    base_one, base_two = len(event_types(one)), len(event_types(two))

    with transaction.atomic(), events_in_one_statement():
        append_event(one.id, "note_a")
        append_event(two.id, "note_b")
        append_event(one.id, "note_c", step_id="worker", payload={"n": 1})
        assert not WorkflowEvent.objects.filter(event_type__startswith="note").exists()

    assert event_types(one)[base_one:] == [
        (base_one + 1, "note_a", None),
        (base_one + 2, "note_c", "worker"),
    ]
    assert event_types(two)[base_two:] == [(base_two + 1, "note_b", None)]
    assert one.events.get(event_type="note_c").payload_json == {"n": 1}

    with pytest.raises(RuntimeError), transaction.atomic():
        with events_in_one_statement():
            append_event(one.id, "note_lost")
            raise RuntimeError("boom")
    assert not WorkflowEvent.objects.filter(event_type="note_lost").exists()


def test_the_account_gate_reads_registry_cooldown_and_running_in_one_statement(
    agent: FakeAgent, tmp_path: Path
) -> None:
    now = timezone.now()
    services.account_add(name="acctA", provider="codewith", max_running=2)
    services.account_set_enabled(name="acctA", enabled=False)
    AccountCooldown.objects.create(
        account_profile="acctA", until=now + timedelta(minutes=5), reason="429"
    )
    AccountCooldown.objects.create(
        account_profile="acctB", until=now - timedelta(minutes=5), reason="old"
    )
    _started(admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctB")]))

    statements: list[str] = []

    def count(execute: Any, sql: str, *args: Any) -> Any:
        statements.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(count):
        a = account_gate("acctA", now=now)
        b = account_gate("acctB", now=now)
        c = account_gate("nobody", now=now)
    assert len(statements) == 3
    assert a.account is not None and a.account.provider == "codewith"
    assert a.account.enabled is False and a.account.max_running == 2
    assert a.cooling_until is not None and a.cooling_until > now and a.running == 0
    assert b.account is None and b.cooling_until is None and b.running == 1
    assert c.account is None and c.cooling_until is None and c.running == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_two_step_run_costs_at_most_half_the_statements_it_used_to(
    agent: FakeAgent, tmp_path: Path
) -> None:
    """66 statements per 2-step run on SQLite and 70 on PostgreSQL before issue 18; the
    step boundaries in one transaction each bring it to at most 33 (counted, not timed;
    SQLite's BEGIN IMMEDIATE included). Issue 39 adds each step's attempt record (an insert
    at its start, an update at its end, inside those same transactions): 37. The first run
    of a process also records the process's instance (issue 43: a read, then its insert in a
    transaction of its own), once per process: 3 more, that run only. Issue 58 reads the
    task's hold (ledger.claims) at a step's own start, the first step's: 38. Issue 60 reads
    the revision round a run carries out when it starts and its item's waiting revisions
    when it ends: 40."""
    counts = []
    for _ in range(2):
        run = _two_steps(tmp_path, worker="acctA", verifier="acctB")
        statements: list[str] = []

        def count(execute: Any, sql: str, *args: Any) -> Any:
            statements.append(sql)  # noqa: B023 (used before the loop moves on)
            return execute(sql, *args)

        with connection.execute_wrapper(count):
            assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
        counts.append(len(statements))
    assert counts[0] <= 40 + 3 and counts[1] <= 40, counts
