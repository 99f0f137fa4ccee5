"""The run queue: runs go to the run cluster's queue, a waiting step hands its run back to the
queue with a delay (no worker held), and runs whose task is gone are handed out again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.tasks import async_task

from ledger import queue, services
from ledger.models import RunStatus, StepStatus, WorkflowRun
from runs import tasks
from runs.runner import HANDED_BACK, NOT_CLAIMED
from tests.ledger.runner_helpers import (
    FakeAgent,
    admit_workflow,
    agent_step,
    steps_of,
)

pytestmark = pytest.mark.django_db


def _admit(steps: list[dict[str, Any]]) -> WorkflowRun:
    """A run as admission leaves it, its task queued (as routing.admission does)."""
    run = admit_workflow(steps)
    queue.enqueue_run_workflow(run.id)
    return run


def _run_rows(run_id: str) -> list[OrmQ]:
    return [
        row
        for row in OrmQ.objects.order_by("id")
        if row.task.get("func") == queue.RUN_TASK and row.task["args"] == (run_id,)
    ]


def _blocked_run(tmp_path: Path) -> tuple[WorkflowRun, str]:
    """A run whose only step waits: its account carries a running step at cap 1."""
    busy = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    services.run_claim(run_id=busy.id, worker="other-host:1")
    busy_step = steps_of(busy)["worker"]
    assert services.step_start(step_run_id=busy_step.id, worker="other-host:1").started
    run = _admit(
        [agent_step("worker", cwd=tmp_path, profile="acctA", max_per_profile=1)]
    )
    return run, busy_step.id


def test_runs_are_queued_for_the_run_cluster_and_drains_for_the_main_one() -> None:
    run = _admit([agent_step("worker", cwd="/tmp", profile=None)])
    async_task("routing.tasks.drain", "generic", {})
    keys = {row.task["func"]: row.key for row in OrmQ.objects.all()}
    assert keys == {
        "runs.tasks.run_workflow": django_settings.LOOPSWEB_RUN_CLUSTER,
        "routing.tasks.drain": Conf.CLUSTER_NAME,
    }
    assert Conf.CLUSTER_NAME == "loopsweb" != django_settings.LOOPSWEB_RUN_CLUSTER
    assert [r.key for r in _run_rows(run.id)] == ["loopsweb-runs"]


@pytest.mark.slow
def test_a_waiting_step_hands_its_run_back_to_the_queue_and_the_next_delivery_resumes(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_STEP_START_POLL_SECONDS = 5
    run, busy_step_id = _blocked_run(tmp_path)
    OrmQ.objects.all().delete()
    before = timezone.now()

    assert tasks.run_workflow(run.id) == HANDED_BACK

    run.refresh_from_db()
    # Still running (the item stays active, the step keeps its account reservation), but no
    # worker holds it and recovery leaves it alone.
    assert run.status == RunStatus.RUNNING and run.claimed_by is None
    assert before + timedelta(seconds=5) <= run.lease_expires_at
    later = timezone.now() + timedelta(hours=1)
    recoverable = services.runs_recover_expired(now=later, dry_run=True)
    assert run.id not in [r.run_id for r in recoverable]
    (row,) = _run_rows(run.id)
    assert row.key == "loopsweb-runs"
    # Due in the poll interval: the broker hands it out no earlier.
    assert (
        before + timedelta(seconds=5)
        <= row.lock
        <= timezone.now() + timedelta(seconds=5)
    )
    assert steps_of(run)["worker"].status == StepStatus.PENDING

    # Delivered again while the account is still full: handed back again, one event only.
    assert tasks.run_workflow(run.id) == HANDED_BACK
    assert run.events.filter(event_type="step_waiting").count() == 1

    services.step_finish(
        step_run_id=busy_step_id, status=StepStatus.SUCCEEDED, exit_code=0
    )
    assert tasks.run_workflow(run.id) == RunStatus.SUCCEEDED
    # A duplicate delivery of the handed-back task changes nothing.
    assert tasks.run_workflow(run.id) == NOT_CLAIMED
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert len(agent.records()) == 1
    assert [e for e in run.events.values_list("event_type", flat=True)].count(
        "claimed"
    ) == 1


@pytest.mark.slow
def test_a_two_step_run_resumes_after_the_step_already_done(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    busy = admit_workflow([agent_step("other", cwd=tmp_path, profile="acctB")])
    services.run_claim(run_id=busy.id, worker="other-host:1")
    busy_step = steps_of(busy)["other"]
    services.step_start(step_run_id=busy_step.id, worker="other-host:1")
    run = _admit(
        [
            agent_step("worker", cwd=tmp_path, profile="acctA"),
            agent_step(
                "verifier",
                cwd=tmp_path,
                profile="acctB",
                depends_on=["worker"],
                max_per_profile=1,
            ),
        ]
    )
    assert tasks.run_workflow(run.id) == HANDED_BACK
    assert steps_of(run)["worker"].status == StepStatus.SUCCEEDED
    services.step_finish(
        step_run_id=busy_step.id, status=StepStatus.SUCCEEDED, exit_code=0
    )
    assert tasks.run_workflow(run.id) == RunStatus.SUCCEEDED
    # The worker step ran once, the verifier once.
    assert sorted(r["step"] for r in agent.records()) == ["verifier", "worker"]


def test_a_cancelled_parked_run_is_not_resumed(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run, _ = _blocked_run(tmp_path)
    assert tasks.run_workflow(run.id) == HANDED_BACK
    services.run_cancel(run_id=run.id, reason="operator stop")
    assert tasks.run_workflow(run.id) == NOT_CLAIMED
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and agent.records() == []


@pytest.mark.slow
def test_recovery_enqueues_again_queued_and_parked_runs_whose_task_is_gone(
    agent: FakeAgent, tmp_path: Path
) -> None:
    lost = _admit([agent_step("worker", cwd=tmp_path, profile=None)])
    kept = _admit([agent_step("worker", cwd=tmp_path, profile=None)])
    parked, _ = _blocked_run(tmp_path)
    assert tasks.run_workflow(parked.id) == HANDED_BACK
    old = timezone.now() - timedelta(minutes=5)
    WorkflowRun.objects.filter(pk__in=[lost.id, kept.id]).update(updated_at=old)
    WorkflowRun.objects.filter(pk=parked.id).update(lease_expires_at=old)
    # The broker rows of `lost` and of the parked run are gone (dropped, deleted).
    for row in _run_rows(lost.id) + _run_rows(parked.id):
        row.delete()
    assert tasks.runs_with_a_task() >= {kept.id} and lost.id not in (
        tasks.runs_with_a_task()
    )

    tasks.recover_expired_runs()

    assert len(_run_rows(lost.id)) == 1 and len(_run_rows(parked.id)) == 1
    assert len(_run_rows(kept.id)) == 1  # its task is still there: not doubled
    # Once per window: a second pass right after enqueues nothing more.
    tasks.recover_expired_runs()
    assert len(_run_rows(lost.id)) == 1 and len(_run_rows(parked.id)) == 1
    # What was handed out runs.
    assert tasks.run_workflow(lost.id) == RunStatus.SUCCEEDED


def test_a_task_signed_with_another_key_does_not_count_as_the_run_s_task(
    tmp_path: Path, settings: Any
) -> None:
    run = _admit([agent_step("worker", cwd=tmp_path, profile=None)])
    (row,) = _run_rows(run.id)
    # What a process with its own key queued: this installation cannot read it.
    OrmQ.objects.filter(pk=row.pk).update(payload="x" + row.payload)
    WorkflowRun.objects.filter(pk=run.id).update(
        updated_at=timezone.now() - timedelta(minutes=5)
    )
    assert run.id not in tasks.runs_with_a_task()
    tasks.recover_expired_runs()
    assert len(_run_rows(run.id)) == 1


# The scheduler closes old connections first: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_a_retry_s_one_off_schedule_queues_the_run_on_the_run_cluster_s_queue(
    tmp_path: Path,
) -> None:
    from django_q.models import Schedule
    from django_q.scheduler import scheduler

    run = admit_workflow([agent_step("worker", cwd=tmp_path, profile=None)])
    queue.enqueue_run_workflow(
        run.id, not_before=timezone.now() + timedelta(seconds=30)
    )
    assert _run_rows(run.id) == []
    assert run.id in tasks.runs_with_a_task()  # a pending schedule is its task
    Schedule.objects.filter(name=f"run-workflow-{run.id}").update(
        next_run=timezone.now() - timedelta(seconds=1)
    )
    scheduler()  # what the main cluster's scheduler does when the schedule is due
    assert [r.key for r in _run_rows(run.id)] == ["loopsweb-runs"]
