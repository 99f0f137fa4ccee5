"""Account loads kept per account never drift from the rows (docs/design.md rule 1), on both databases.

A random sequence of every lifecycle transition that moves load (admit, claim, step start,
finish, skip, run finalize with loop-level retries, cancel, lease recovery, item cancel, a
claim that finds its item ended, loop pause/resume/archive/stop/delete) runs through the real services; after each operation the kept counts must equal a
recount of the rows. The `recount_account_loads` command reports and repairs drift, in a
subprocess as operators run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ledger import services
from ledger.lock import admission_lock
from ledger.models import (
    AccountLoadCount,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkItemStatus,
)
from ledger.selectors import account_state
from ledger.services.account_loads import (
    account_load_drift,
    read_account_loads,
    read_snapshot,
    recount_account_loads,
    repair_account_loads,
)
from tests.account_loads import assert_account_counts_match_rows
from tests.factories import make_spec, make_work_item
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage

pytestmark = pytest.mark.django_db

WORKER = "host:1"
ACCOUNTS = ("acctA", "acctB", "acctC")

# A step: None = a command step (no account), else an agent step on that account.
step_accounts = st.lists(st.sampled_from((None, *ACCOUNTS)), min_size=1, max_size=3)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), step_accounts, st.booleans()),
        st.tuples(
            st.sampled_from(
                (
                    "claim",
                    "start",
                    "finish",
                    "fail_step",
                    "finish_then_start",
                    "finish_then_end",
                    "fail_then_end",
                    "move_after_fail",
                    "skip",
                    "succeed_run",
                    "fail_run",
                    "cancel_run",
                    "recover",
                    "cancel_item",
                    "end_item_then_claim",
                    "pause_loop",
                    "resume_loop",
                    "archive_loop",
                    "stop_loop",
                    "expire_loop",
                    "delete_loop",
                )
            ),
            st.integers(min_value=0, max_value=50),
            st.booleans(),
        ),
    ),
    min_size=1,
    max_size=25,
)


def _step(index: int, account: str | None, capped: bool) -> dict[str, Any]:
    if account is None:
        return {"id": f"s{index}", "target": {"type": "command", "command": "true"}}
    routing = {"maxPerProfile": 1} if capped else {}
    return {
        "id": f"s{index}",
        "target": {
            "type": "agent",
            "provider": "codewith",
            "authProfile": account,
            **({"routing": routing} if routing else {}),
        },
    }


def _admit(accounts: list[str | None], capped: bool, max_attempts: int = 1) -> None:
    item = make_work_item()
    # Pool routing over the accounts: a step whose account is full or cooling moves to a
    # free member at its start, and after a rate limit (ledger.services.failover).
    item.invocation.scope_json = {
        "providerRouting": {
            "poolRouting": True,
            "pool": list(ACCOUNTS),
            "provider": "codewith",
        }
    }
    item.invocation.save(update_fields=["scope_json"])
    spec = make_spec(steps_json=[_step(i, a, capped) for i, a in enumerate(accounts)])
    with transaction.atomic():
        admission_lock()
        services.work_item_admit(
            item=item,
            spec=spec,
            invocation=item.invocation,
            loop_name=f"loop-{item.id}",
            loop_description="test",
            reason="admitted by test",
            now=timezone.now(),
            max_attempts=max_attempts,
            retry_delay_ms=0,
        )


def _pick(queryset: Any, n: int) -> Any:
    rows = list(queryset.order_by("id"))
    return rows[n % len(rows)] if rows else None


def _apply(op: tuple[Any, ...]) -> None:
    name = op[0]
    if name == "admit":
        # Two attempts: a failed run queues a loop-level retry (a new reserving run).
        _admit(op[1], op[2], max_attempts=2)
        return
    n = op[1]
    runs = WorkflowRun.objects.all()
    try:
        if name == "claim":
            run = _pick(runs.filter(status=RunStatus.QUEUED), n)
            if run:
                services.run_claim(run_id=run.id, worker=WORKER)
        elif name == "end_item_then_claim":
            run = _pick(runs.filter(status=RunStatus.QUEUED), n)
            if run:  # an operator ended the item first: the claim cancels the run
                run.work_item.__class__.objects.filter(pk=run.work_item_id).update(
                    status=WorkItemStatus.CANCELLED
                )
                services.run_claim(run_id=run.id, worker=WORKER)
        elif name == "start":
            step = _pick(
                WorkflowStepRun.objects.filter(
                    workflow_run__status=RunStatus.RUNNING,
                    status__in=(StepStatus.PENDING, StepStatus.FAILED),
                ),
                n,
            )
            if step:
                services.step_start(step_run_id=step.id, worker=WORKER)
        elif name in ("finish", "fail_step"):
            step = _pick(
                WorkflowStepRun.objects.filter(
                    workflow_run__status=RunStatus.RUNNING, status=StepStatus.RUNNING
                ),
                n,
            )
            if step:
                services.step_finish(
                    step_run_id=step.id,
                    status=StepStatus.SUCCEEDED
                    if name == "finish"
                    else StepStatus.FAILED,
                    exit_code=0 if name == "finish" else 1,
                )
        elif name in ("finish_then_start", "finish_then_end", "fail_then_end"):
            # The runner's step boundary: finish, then start the next step or end the run.
            step = _pick(
                WorkflowStepRun.objects.filter(
                    workflow_run__status=RunStatus.RUNNING, status=StepStatus.RUNNING
                ),
                n,
            )
            if step:
                following = (
                    WorkflowStepRun.objects.filter(
                        workflow_run_id=step.workflow_run_id, status=StepStatus.PENDING
                    )
                    .order_by("sequence")
                    .first()
                )
                failed = name == "fail_then_end"
                services.step_complete(
                    step_run_id=step.id,
                    worker=WORKER,
                    result=services.StepResult(
                        status=StepStatus.FAILED if failed else StepStatus.SUCCEEDED,
                        exit_code=1 if failed else 0,
                    ),
                    start_next=following.id
                    if following and name == "finish_then_start"
                    else None,
                    end=None
                    if name == "finish_then_start"
                    else services.RunEnd(
                        status=RunStatus.FAILED if failed else RunStatus.SUCCEEDED,
                        skip_reason="not run: test" if failed else None,
                    ),
                )
        elif name == "move_after_fail":
            step = _pick(
                WorkflowStepRun.objects.filter(
                    workflow_run__status=RunStatus.RUNNING, status=StepStatus.FAILED
                ),
                n,
            )
            if step:
                services.step_move_after_failure(
                    step_run_id=step.id, reason="429 from test"
                )
        elif name == "skip":
            step = _pick(
                WorkflowStepRun.objects.filter(
                    workflow_run__status=RunStatus.RUNNING,
                    status__in=(StepStatus.PENDING, StepStatus.RUNNING),
                ),
                n,
            )
            if step:
                services.step_skip(step_run_id=step.id, reason="skipped by test")
        elif name in ("succeed_run", "fail_run"):
            run = _pick(
                runs.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING)), n
            )
            if run:
                services.run_finalize(
                    run_id=run.id,
                    status=RunStatus.SUCCEEDED
                    if name == "succeed_run"
                    else RunStatus.FAILED,
                )
        elif name == "cancel_run":
            run = _pick(
                runs.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING)), n
            )
            if run:
                services.run_cancel(run_id=run.id, reason="cancelled by test")
        elif name == "recover":
            run = _pick(runs.filter(status=RunStatus.RUNNING), n)
            if run:
                WorkflowRun.objects.filter(pk=run.id).update(
                    lease_expires_at=timezone.now() - timedelta(seconds=1)
                )
                services.runs_recover_expired()
        elif name == "cancel_item":
            run = _pick(runs.exclude(work_item=None), n)
            if run:
                services.work_item_cancel(
                    item_id=run.work_item_id, reason="cancelled by test"
                )
        elif name.endswith("_loop"):
            run = _pick(runs.exclude(loop=None), n)
            if run:
                services.loop_status_change(
                    loop_id=run.loop_id, action=name.removesuffix("_loop")
                )
    except services.LedgerError:
        pass  # a transition the state does not allow changes nothing


@settings(
    max_examples=int(os.environ.get("LOOPSWEB_HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations)
# Always tried: a capped step whose account is full moves to a free pool member at its start
# (the run's reservation moves with it), then the runner's step boundaries.
@example(
    ops=[
        ("admit", ["acctA", "acctB"], True),
        ("admit", ["acctA", "acctA"], True),
        ("claim", 0, False),
        ("claim", 0, False),
        ("start", 0, False),
        ("start", 1, False),
        ("finish_then_start", 0, False),
        ("fail_then_end", 0, False),
        ("move_after_fail", 0, False),
    ]
)
@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_kept_counts_equal_a_recount_after_every_operation(ops: list[Any]) -> None:
    for op in ops:
        _apply(op)
        assert_account_counts_match_rows()
    # and admission reads exactly those counts
    running, reserved = recount_account_loads()
    load = account_state().load
    assert (load.running, load.reserved) == (running, reserved)


def test_admit_reserves_the_first_account_step_and_start_moves_it_to_running() -> None:
    _admit([None, "acctA", "acctB"], False)
    assert read_account_loads() == ({}, {"acctA": 1})
    run = WorkflowRun.objects.get()
    services.run_claim(run_id=run.id, worker=WORKER)
    assert read_account_loads() == ({}, {"acctA": 1})  # claimed, no step started yet
    first, second, third = WorkflowStepRun.objects.filter(workflow_run=run).order_by(
        "sequence"
    )
    services.step_start(step_run_id=first.id, worker=WORKER)  # the command step
    assert read_account_loads() == ({}, {})  # a started run reserves nothing more
    services.step_finish(step_run_id=first.id, status=StepStatus.SUCCEEDED)
    services.step_start(step_run_id=second.id, worker=WORKER)
    assert read_account_loads() == ({"acctA": 1}, {})
    services.run_finalize(run_id=run.id, status=RunStatus.FAILED)
    assert read_account_loads() == ({}, {})
    assert_account_counts_match_rows()


def test_repair_sets_drifted_counts_back_to_the_rows() -> None:
    _admit(["acctA"], False)
    AccountLoadCount.objects.filter(pk="acctA").update(reserved=7, running=-1)
    AccountLoadCount.objects.create(account_profile="ghost", running=2)
    drift = account_load_drift()
    assert [d.account_profile for d in drift] == ["acctA", "ghost"]
    assert repair_account_loads(dry_run=True) == drift
    assert account_load_drift() == drift  # a dry run changes nothing
    assert repair_account_loads() == drift
    assert account_load_drift() == []
    assert_account_counts_match_rows()


def _admit_from_another_connection() -> None:
    """Admit one run reserving acctA and commit it, from a thread with its own connection."""
    from django.db import connection

    def admit() -> None:
        try:
            _admit(["acctA"], False)
        finally:
            connection.close()

    thread = threading.Thread(target=admit)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()


@pytest.mark.postgres  # SQLite's IMMEDIATE transaction keeps the other writer out meanwhile
@pytest.mark.django_db(transaction=True)
def test_a_commit_between_the_two_reads_is_no_drift_inside_one_snapshot() -> None:
    # Without a snapshot, READ COMMITTED shows the commit to the second read only.
    kept = read_account_loads()
    _admit_from_another_connection()
    assert recount_account_loads() != kept
    # One snapshot: both reads see the state before the commit.
    with read_snapshot():
        kept = read_account_loads()
        _admit_from_another_connection()
        assert recount_account_loads() == kept
    assert account_load_drift() == []
    assert read_account_loads() == ({}, {"acctA": 2})


def _command(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DATABASE_URL=child_database_url(), LOOPSWEB_TESTING="1")
    return manage(env, "recount_account_loads", *args, check=False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_recount_command_reports_and_repairs_drift_in_a_subprocess() -> None:
    _admit(["acctB"], False)
    AccountLoadCount.objects.filter(pk="acctB").update(reserved=5)

    dry = _command("--dry-run", "--json")
    assert dry.returncode == 1, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dryRun"] is True and report["repaired"] == 0
    assert report["drift"] == [
        {
            "accountProfile": "acctB",
            "kept": {"running": 0, "reserved": 5},
            "rows": {"running": 0, "reserved": 1},
        }
    ]
    assert (
        AccountLoadCount.objects.get(pk="acctB").reserved == 5
    )  # dry run wrote nothing

    fixed = _command()
    assert fixed.returncode == 0, fixed.stderr
    assert "repaired 1 account(s)" in fixed.stdout
    assert AccountLoadCount.objects.get(pk="acctB").reserved == 1

    clean = _command("--json")
    assert clean.returncode == 0
    assert json.loads(clean.stdout)["drift"] == []
