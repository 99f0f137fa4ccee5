"""Lifecycle and operator services around the runner, its commands and django-q2 tasks."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from domain.errors import ValidationError
from domain.steps import PlanError, execution_order
from ledger import services, tasks
from ledger.models import (
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkItemStatus,
)
from routing.admission import CREATED, DEDUPED, retry_run
from routing.drains.schedules import SCHEDULES
from routing.models import InboxEvent, InboxState
from tests.ledger.runner_helpers import (
    FakeAgent,
    admit_workflow,
    agent_step,
    route_generic,
    steps_of,
)
from tests.processes import ROOT, scratch_cwd

pytestmark = pytest.mark.django_db


# --- ordering (pure) ----------------------------------------------------------------------------


def test_execution_order_puts_dependencies_first_and_breaks_ties_by_sequence() -> None:
    steps = [("c", 0), ("a", 1), ("b", 2), ("d", 3)]
    specs = {
        "c": {"dependsOn": ["a", "b"]},
        "a": {},
        "b": {"dependsOn": "a"},
        "d": {"dependsOn": []},
    }
    assert execution_order(steps, specs) == ["a", "b", "c", "d"]
    with pytest.raises(PlanError, match="dependency cycle among steps: a, b"):
        execution_order(
            [("a", 0), ("b", 1)], {"a": {"dependsOn": ["b"]}, "b": {"dependsOn": ["a"]}}
        )
    with pytest.raises(PlanError, match="dependency cycle among steps: a"):
        execution_order([("a", 0)], {"a": {"dependsOn": ["a"]}})
    with pytest.raises(PlanError, match="step x is not in the workflow spec"):
        execution_order([("x", 0)], {})


# --- django-q2 ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_admission_enqueues_the_run_in_its_own_transaction(tmp_path: Path) -> None:
    result = route_generic(tmp_path, auth_profile="acctA")
    assert result.kind == CREATED
    (queued,) = OrmQ.objects.all()
    assert queued.task["func"] == "runs.tasks.run_workflow"
    assert queued.task["args"] == (result.run.id,)
    # The task row commits or rolls back with the admission: a failed admission leaves none.
    with pytest.raises(RuntimeError), transaction.atomic():
        assert route_generic(tmp_path, auth_profile="acctA").kind == CREATED
        raise RuntimeError("admission failed after enqueue")
    assert OrmQ.objects.count() == 1 and WorkflowRun.objects.count() == 1


def test_with_another_broker_or_sync_mode_the_run_is_enqueued_on_commit(
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "ORM", None)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        route_generic(tmp_path, auth_profile="acctA")
    assert len(callbacks) == 1 and OrmQ.objects.count() == 0


@pytest.mark.slow
def test_the_run_workflow_task_runs_the_run_and_a_redelivery_is_a_no_op(
    agent: FakeAgent, tmp_path: Path
) -> None:
    result = route_generic(tmp_path, auth_profile="acctA")

    assert tasks.run_workflow(result.run.id) == RunStatus.SUCCEEDED
    assert tasks.run_workflow(result.run.id) == "not-claimed"

    result.run.refresh_from_db()
    assert result.run.status == RunStatus.SUCCEEDED
    assert len(agent.records()) == 2  # worker + verifier, once each


def test_the_recovery_task_is_a_built_in_schedule_every_minute() -> None:
    (spec,) = [s for s in SCHEDULES if s.func == "runs.tasks.recover_expired_runs"]
    assert spec.minutes == 1
    call_command("sync_schedules", stdout=io.StringIO())
    schedule = Schedule.objects.get(name=spec.name)
    assert schedule.func == "runs.tasks.recover_expired_runs"
    assert schedule.schedule_type == Schedule.MINUTES and schedule.minutes == 1
    assert tasks.recover_expired_runs() == 0


# --- commands -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_workflow_command_refuses_unknown_and_non_queued_runs(
    agent: FakeAgent, tmp_path: Path
) -> None:
    with pytest.raises(CommandError, match="workflow run not found: nope"):
        call_command("run_workflow", "nope", stdout=io.StringIO())
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])
    out = io.StringIO()
    call_command("run_workflow", run.id, stdout=out)
    assert out.getvalue().strip() == f"run {run.id} succeeded"
    with pytest.raises(
        CommandError, match=f"workflow run is not queued: {run.id} status=succeeded"
    ):
        call_command("run_workflow", run.id, stdout=io.StringIO())


@pytest.mark.slow
def test_run_workflow_command_fails_when_the_run_fails(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.env(exit="4")
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])
    with pytest.raises(CommandError, match=f"run {run.id} failed: step worker failed"):
        call_command("run_workflow", run.id, stdout=io.StringIO())


def test_recover_runs_command_dry_run_and_json(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])
    past = timezone.now() - timedelta(hours=1)
    services.run_claim(run_id=run.id, worker="gone:1", now=past)

    out = io.StringIO()
    call_command("recover_runs", "--dry-run", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["dryRun"] is True
    assert [r["runId"] for r in report["recovered"]] == [run.id]
    assert report["recovered"][0]["skippedSteps"] == ["worker"]
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING

    out = io.StringIO()
    call_command("recover_runs", stdout=out)
    assert out.getvalue().strip().endswith("recovered 1 expired run(s)")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED


# --- finalize -----------------------------------------------------------------------------------


def test_finalize_refuses_a_terminal_run_and_a_non_terminal_status(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])
    services.run_claim(run_id=run.id, worker="w:1")
    with pytest.raises(
        services.LedgerError, match="not a terminal workflow run status"
    ):
        services.run_finalize(run_id=run.id, status=RunStatus.RUNNING)
    services.run_finalize(run_id=run.id, status=RunStatus.FAILED, error="e1")
    with pytest.raises(
        services.LedgerError,
        match=f"workflow run is already terminal: {run.id} status=failed",
    ):
        services.run_finalize(run_id=run.id, status=RunStatus.SUCCEEDED)
    with pytest.raises(services.NotFound, match="workflow run not found: zzz"):
        services.run_finalize(run_id="zzz", status=RunStatus.FAILED)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error == "e1"
    assert steps_of(run)["worker"].status == StepStatus.SKIPPED


def test_a_claim_of_a_run_whose_item_was_ended_cancels_the_run(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])
    item = run.work_item
    type(item).objects.filter(pk=item.id).update(status=WorkItemStatus.DEAD_LETTER)

    assert services.run_claim(run_id=run.id, worker="w:1") is None

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert (
        run.error == f"workflow work item is not runnable: {item.id} status=dead_letter"
    )
    item.refresh_from_db()
    assert item.status == WorkItemStatus.DEAD_LETTER


@pytest.mark.slow
def test_a_succeeded_run_keeps_the_admission_reason_on_its_item(
    agent: FakeAgent, tmp_path: Path
) -> None:
    result = route_generic(tmp_path, auth_profile="acctA")
    tasks.run_workflow(result.run.id)
    item = result.work_item
    item.refresh_from_db()
    # COALESCE(run error = NULL, old reason): upstream keeps the admission reason.
    assert item.status == WorkItemStatus.SUCCEEDED
    assert item.last_reason == "admitted by generic-event route"
    assert item.attempts == 1


# --- operator services --------------------------------------------------------------------------


@pytest.mark.slow
def test_requeue_needs_a_reason_and_a_terminal_item_and_keeps_attempts(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.env(exit="1")
    result = route_generic(tmp_path, "evt-requeue", auth_profile="acctA")
    item = result.work_item
    inbox = InboxEvent.objects.create(
        source="ci",
        event_id="evt-requeue",
        event_type="build.failed",
        state=InboxState.ADMITTED,
        work_item=item,
    )
    with pytest.raises(
        services.LedgerError,
        match=f"workflow work item is not requeueable: {item.id} status=admitted",
    ):
        services.work_item_requeue(item_id=item.id, reason="again")
    tasks.run_workflow(result.run.id)
    with pytest.raises(
        ValidationError, match="routes requeue requires --reason <text>"
    ):
        services.work_item_requeue(item_id=item.id, reason="  ")
    with pytest.raises(services.NotFound, match="workflow work item not found: nope"):
        services.work_item_requeue(item_id="nope", reason="x")

    services.work_item_requeue(item_id=item.id, reason="flaky CI, retry")

    item.refresh_from_db()
    assert item.status == WorkItemStatus.QUEUED and item.attempts == 1
    assert (item.workflow_id, item.loop_id, item.workflow_run_id) == (None, None, None)
    assert item.lease_expires_at is None and item.last_reason == "flaky CI, retry"
    inbox.refresh_from_db()
    assert inbox.state == InboxState.PENDING  # the next drain routes it again
    again = route_generic(tmp_path, "evt-requeue", auth_profile="acctA")
    assert again.kind == CREATED and again.work_item.id == item.id
    again.work_item.refresh_from_db()
    assert again.work_item.attempts == 2


@pytest.mark.slow
def test_run_retry_readmits_the_latest_failed_run_only(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.env(exit="1")
    result = route_generic(tmp_path, "evt-retry", auth_profile="acctA")
    with pytest.raises(services.LedgerError, match="workflow run is not retryable"):
        retry_run(run_id=result.run.id)
    tasks.run_workflow(result.run.id)

    item = retry_run(run_id=result.run.id)

    # Admitted again at once with the route the item stores (routing.admission.retry).
    assert item.status == WorkItemStatus.ADMITTED and item.attempts == 2
    assert item.workflow_run_id not in (None, result.run.id)
    assert item.last_reason.startswith(f"retry of workflow run {result.run.id}")
    with pytest.raises(services.LedgerError, match="not requeueable"):
        retry_run(run_id=result.run.id)
    tasks.run_workflow(item.workflow_run_id)
    with pytest.raises(
        services.LedgerError, match="is not the latest run of work item"
    ):
        retry_run(run_id=result.run.id)


def test_cancelling_an_admitted_item_cancels_its_run_and_dead_letter_parks_it(
    agent: FakeAgent, tmp_path: Path
) -> None:
    result = route_generic(tmp_path, "evt-cancel", auth_profile="acctA")
    item = result.work_item
    with pytest.raises(
        services.LedgerError, match="not dead-letterable: .* status=admitted"
    ):
        services.work_item_dead_letter(item_id=item.id, reason="stop")

    services.work_item_cancel(item_id=item.id, reason="wrong repo")

    item.refresh_from_db()
    result.run.refresh_from_db()
    assert item.status == WorkItemStatus.CANCELLED and item.last_reason == "wrong repo"
    assert result.run.status == RunStatus.CANCELLED
    assert {s.status for s in steps_of(result.run).values()} == {StepStatus.CANCELLED}
    with pytest.raises(
        services.LedgerError, match="not cancellable: .* status=cancelled"
    ):
        services.work_item_cancel(item_id=item.id, reason="again")

    services.work_item_dead_letter(item_id=item.id, reason="parked by operator")

    item.refresh_from_db()
    assert item.status == WorkItemStatus.DEAD_LETTER
    # A dead-lettered item dedupes later deliveries of its event.
    assert route_generic(tmp_path, "evt-cancel", auth_profile="acctA").kind == DEDUPED


def test_cancelling_a_deferred_item_needs_no_run(tmp_path: Path) -> None:
    first = route_generic(tmp_path, max_active=1, auth_profile="acctA")
    deferred = route_generic(tmp_path, max_active=1, auth_profile="acctA")
    assert first.kind == CREATED and deferred.kind == "throttled"
    services.work_item_cancel(item_id=deferred.work_item.id, reason="not needed")
    deferred.work_item.refresh_from_db()
    assert deferred.work_item.status == WorkItemStatus.CANCELLED
    first.run.refresh_from_db()
    assert first.run.status == RunStatus.QUEUED


# --- cooldown episodes --------------------------------------------------------------------------


def test_cooldown_backoff_doubles_within_an_episode_and_restarts_after_a_quiet_period(
    settings: Any,
) -> None:
    settings.LOOPSWEB_COOLDOWN_BASE_SECONDS = 10
    settings.LOOPSWEB_COOLDOWN_CAP_SECONDS = 35
    t0 = timezone.now()

    def record(at: Any) -> AccountCooldown:
        return services.account_cooldown_record(
            profile="p", tool="codewith", until=None, reason="429", now=at
        )

    assert record(t0).until == t0 + timedelta(seconds=10)
    assert record(t0).until == t0 + timedelta(seconds=20)
    assert record(t0).until == t0 + timedelta(seconds=35)  # capped (40 > 35)
    assert record(t0).reports == 4
    # Long after the last deadline (more than the cap), a new report starts a new episode.
    later = t0 + timedelta(hours=1)
    fresh = record(later)
    assert fresh.reports == 1 and fresh.until == later + timedelta(seconds=10)


@pytest.mark.slow
def test_step_attribution_follows_account_refs_for_any_step_kind(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow(
        [
            agent_step("pinned", cwd=tmp_path, profile="acct1"),
            agent_step(
                "claude",
                cwd=tmp_path,
                provider="claude",
                profile=None,
                account={"profile": "p", "tool": "claude"},
            ),
            {
                "id": "cmd",
                "kind": "command",
                "target": {"type": "command", "command": "true"},
                "account": {"profile": "ops"},
            },
        ]
    )
    assert tasks.run_workflow(run.id) == RunStatus.SUCCEEDED
    attribution = {
        s.step_id: (s.account_profile, s.account_tool) for s in steps_of(run).values()
    }
    assert attribution == {
        "pinned": ("acct1", "codewith"),
        "claude": ("p", "claude"),
        "cmd": ("ops", None),
    }
    records = {r["step"]: r for r in agent.records()}
    # An unregistered claude account: its name only, the worker's own login.
    assert records["claude"]["env"]["LOOPSWEB_ACCOUNT_PROFILE"] == "p"
    assert "CLAUDE_CONFIG_DIR" not in records["claude"]["env"]
    assert WorkflowRun.objects.get(pk=run.id).status == RunStatus.SUCCEEDED


# --- settings -----------------------------------------------------------------------------------


def _runner_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LOOPSWEB_") and k not in {"DATABASE_URL"}
    }
    base.update(LOOPSWEB_DATA_DIR=str(tmp_path), **env)
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.LOOPSWEB_PROVIDER_BINARIES, "
        "{k: sorted(v) for k, v in s.LOOPSWEB_RATE_LIMIT_EXIT_CODES.items()}, "
        "s.LOOPSWEB_RUN_LEASE_SECONDS, s.LOOPSWEB_OUTPUT_TAIL_BYTES, "
        "s.LOOPSWEB_COOLDOWN_BASE_SECONDS, s.LOOPSWEB_COOLDOWN_CAP_SECONDS, "
        "s.LOOPSWEB_STEP_START_POLL_SECONDS, s.LOOPSWEB_KILL_GRACE_SECONDS]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=scratch_cwd(),
        # PYTHONPATH: `python -c` imports the project from another cwd
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "loopsweb.settings",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_runner_settings_come_from_the_environment_and_bad_values_are_refused(
    tmp_path: Path,
) -> None:
    defaults = _runner_settings(tmp_path)
    assert defaults.returncode == 0, defaults.stderr
    binaries, codes, *numbers = json.loads(defaults.stdout)
    assert binaries["cursor"] == "cursor-agent" and binaries["codewith"] == "codewith"
    assert codes["claude"] == [] and numbers == [120, 65536, 60, 3600, 5, 5]

    custom = _runner_settings(
        tmp_path,
        LOOPSWEB_CODEWITH_BIN="/opt/bin/codewith",
        LOOPSWEB_CLAUDE_RATE_LIMIT_EXIT_CODES="42, 43",
        LOOPSWEB_RUN_LEASE_SECONDS="30",
    )
    binaries, codes, lease, *_ = json.loads(custom.stdout)
    assert binaries["codewith"] == "/opt/bin/codewith" and codes["claude"] == [42, 43]
    assert lease == 30

    for env, message in [
        (
            {"LOOPSWEB_RUN_LEASE_SECONDS": "0"},
            "LOOPSWEB_RUN_LEASE_SECONDS must be >= 1",
        ),
        (
            {"LOOPSWEB_CODEX_RATE_LIMIT_EXIT_CODES": "x"},
            "LOOPSWEB_CODEX_RATE_LIMIT_EXIT_CODES must be a comma list of integers",
        ),
    ]:
        bad = _runner_settings(tmp_path, **env)
        assert bad.returncode != 0 and message in bad.stderr


@pytest.mark.django_db
def test_queued_runs_whose_task_was_lost_are_handed_out_again_once_per_window() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from ledger.models import WorkflowRun
    from ledger.services import runs_queued_stale
    from tests.routing.helpers import route

    stale = route().run
    fresh = route().run
    WorkflowRun.objects.filter(pk=stale.pk).update(
        updated_at=timezone.now() - timedelta(hours=1)
    )
    assert runs_queued_stale(older_than=timedelta(minutes=30)) == [stale.id]
    assert (
        runs_queued_stale(older_than=timedelta(minutes=30)) == []
    )  # bumped: once per window
    assert WorkflowRun.objects.get(pk=fresh.pk).status == "queued"
