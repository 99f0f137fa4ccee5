"""A run killed with its run cluster keeps its work, with the real
processes: the run cluster (`manage.py qcluster`, the fake agent) is SIGKILLed while the
agent's step runs with a file written and never committed; the restarted cluster fails the
run, commits that file on the run's branch before the retry, and runs the retry, which
succeeds. The item then says which attempt succeeded, its runs are numbered 1 and 2 on the
page and in the API, and `manage.py prune_worktrees` removes the first run's worktree only
once nothing in it is uncommitted: the branch keeps the work."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from ledger.models import (
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from routing.admission import CREATED, route_event, route_options
from runs.worktrees import worktree_branch
from tests.ledger.runner_helpers import (
    child_database_url,
    git,
    git_project,
    kill_group_quietly,
)
from tests.processes import (
    generic_event,
    manage,
    start_qcluster,
    stop_process_group,
    terminal_env,
    wait_until,
)
from tests.routing.api.helpers import bearer, make_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _writing_step(run_id: str) -> WorkflowStepRun | None:
    """The run's worker step once it runs and its agent wrote its file."""
    step = WorkflowStepRun.objects.filter(
        workflow_run_id=run_id, step_id="worker", status=StepStatus.RUNNING
    ).first()
    run = WorkflowRun.objects.get(pk=run_id)
    if step is None or not step.pid or not run.worktree_path:
        return None
    return step if (Path(run.worktree_path) / "half-done.txt").exists() else None


def test_a_run_killed_with_its_cluster_keeps_its_work_and_its_retry_succeeds(
    tmp_path: Path, admin_client: Client
) -> None:
    project = git_project(tmp_path / "project")
    config = tmp_path / "agent.json"
    # The first attempt writes its file, then works on until its cluster is killed.
    config.write_text(
        json.dumps({"steps": {"worker": {"write": "half-done.txt", "sleep": 600}}})
    )
    env = terminal_env(
        Path(settings.DATA_DIR),
        SECRET_KEY=settings.SECRET_KEY,
        DATABASE_URL=child_database_url(),
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*",
        FAKE_AGENT_CONFIG=str(config),
    )
    routed = route_event(
        kind="generic",
        envelope=generic_event(project, 1),
        options=route_options({"max_attempts": 2, "retry_backoff": 0}),
        env={},
    )
    assert routed.kind == CREATED and routed.run is not None
    first, item_id = routed.run.id, routed.run.work_item_id
    log = tmp_path / "runs.log"
    cluster = start_qcluster(env, log, cluster=settings.LOOPSWEB_RUN_CLUSTER)
    agent_pid = None
    try:
        step = wait_until(
            lambda: _writing_step(first), what="the first run's agent to write its file"
        )
        agent_pid = step.pid
        os.killpg(cluster.pid, signal.SIGKILL)  # the cluster dies mid-step
        cluster.wait()
        config.write_text(json.dumps({}))  # the retry succeeds, changing nothing
        cluster = start_qcluster(env, log, cluster=settings.LOOPSWEB_RUN_CLUSTER)
        done = wait_until(
            lambda: WorkflowWorkItem.objects.filter(
                pk=item_id, status="succeeded"
            ).first(),
            timeout=240,
            what="the restarted cluster to fail the run and its retry to succeed",
        )
    finally:
        stop_process_group(cluster)
        kill_group_quietly(agent_pid)

    failed = WorkflowRun.objects.get(pk=first)
    assert failed.status == RunStatus.FAILED and "was restarted" in (failed.error or "")
    # Its work is on its branch, recorded on the run, before its retry ran.
    branch = worktree_branch(first)
    assert failed.commit_error is None and "half-done.txt" in failed.commit_diffstat
    assert failed.commit_head == git(project, "rev-parse", branch).strip()
    assert git(project, "show", f"{branch}:half-done.txt") == first
    (saved,) = failed.events.filter(event_type="work_saved")
    assert saved.payload_json is not None
    assert saved.payload_json["first"] == ["half-done.txt"]
    retry = WorkflowRun.objects.get(pk=done.workflow_run_id)
    assert retry.status == RunStatus.SUCCEEDED and retry.id != first
    assert saved.created_at <= retry.started_at

    # Item 4: the item says which attempt succeeded; the runs are attempts 1 and 2.
    assert done.last_reason == "succeeded on attempt 2"
    _, token = make_token("read")
    body = admin_client.get(f"/api/v1/work-items/{item_id}", **bearer(token)).json()
    assert body["lastReason"] == "succeeded on attempt 2"
    assert [(r["attempt"], r["id"]) for r in body["runs"]] == [
        (1, first),
        (2, retry.id),
    ]
    page = admin_client.get(reverse("ops:work-item", args=[item_id]))
    assert [(r.run.attempt, r.run.id) for r in page.context["runs"]] == [
        (2, retry.id),
        (1, first),
    ]

    # The kept worktree holds nothing uncommitted now: the prune removes it, the work stays.
    assert (Path(failed.worktree_path) / "half-done.txt").exists()
    report = json.loads(
        manage(env, "prune_worktrees", "--keep-seconds", "0", "--json").stdout
    )
    assert {p["runId"]: p["committed"] for p in report["pruned"]} == {first: 0}
    assert report["kept"] == [] and not Path(failed.worktree_path).exists()
    assert git(project, "show", f"{branch}:half-done.txt") == first
