"""Run cluster instances (ledger.instances, runs.cluster_start) and runs that outlive their
host (ledger.services.hostloss), in this process: the worker identity, the refusal of a
taken host name, a dead predecessor's claims, a dead host's parked run, /ops/hosts/."""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone

from ledger.hosts import host_queue, hosts_read_forget, local_roots
from ledger.instances import (
    ALIVE,
    DEAD,
    ELSEWHERE,
    INSTANCE_ENV,
    WorkerId,
    boot_id,
    instance_fate,
    machine_id,
    pid_namespace,
    start_ticks,
)
from ledger.models import ClusterInstance, Host, RunStatus, StepStatus, WorkflowRun
from ledger.reaper import kill_step_process_group
from ledger.services import (
    HOST_GONE_ERROR,
    run_claim,
    run_park,
    runs_end_on_gone_hosts,
)
from routing.admission import CREATED, route_event, route_options
from runs.cluster_start import cluster_start, start_refusal
from runs.runner import run_workflow_run
from runs.worktrees import worktree_branch, worktree_dir
from tests.account_loads import assert_account_counts_match_rows
from tests.factories import make_step_run
from tests.ledger.runner_helpers import (
    FakeAgent,
    git,
    git_project,
    route_generic,
    steps_of,
)
from tests.processes import generic_event, scratch_cwd

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _own_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    # cluster_start writes the instance into the environment: undone after each test.
    monkeypatch.delenv(INSTANCE_ENV, raising=False)


def test_a_worker_id_round_trips_and_reads_older_and_foreign_identities() -> None:
    worker = WorkerId(host="build:1", pid=4, instance="0a1b2c3d")
    assert str(worker) == "build:1:4@0a1b2c3d"
    assert WorkerId.parse(str(worker)) == worker
    assert WorkerId.parse("hostB:4") == WorkerId("hostB", 4, "")
    assert WorkerId.parse("a@b:12") == WorkerId("a@b", 12, "")
    for foreign in ("w", "seed-worker", "", None, "host:", ":4", "host:x@abc"):
        assert WorkerId.parse(foreign) is None, foreign
    here = WorkerId.here()
    assert here.pid == os.getpid() and here.host == settings.LOOPSWEB_HOST_NAME
    assert here.instance and WorkerId.parse(str(here)) == here


def _instance(name: str, host: str, **fields: object) -> ClusterInstance:
    values: dict[str, object] = {
        "machine_id": machine_id(),
        "boot_id": boot_id(),
        "pid_namespace": pid_namespace(),
        "pid": os.getpid(),
        "pid_started": start_ticks(os.getpid()),
        "roots": local_roots(),
        "seen_at": timezone.now(),
        **fields,
    }
    return ClusterInstance.objects.create(instance=name, host=host, **values)


def test_the_fate_of_another_instance_is_read_from_what_cannot_repeat() -> None:
    assert instance_fate(_instance("alive", "h")) == ALIVE
    assert instance_fate(_instance("reused", "h", pid_started=1)) == DEAD
    assert instance_fate(_instance("rebooted", "h", boot_id="other-boot")) == DEAD
    assert instance_fate(_instance("container", "h", pid_namespace="pid:[1]")) == DEAD
    assert instance_fate(_instance("far", "h", machine_id="m2/else")) == ELSEWHERE


def test_a_cluster_is_refused_while_its_name_is_live_elsewhere_or_with_other_roots() -> (
    None
):
    me, now = settings.LOOPSWEB_HOST_NAME, timezone.now()
    roots = local_roots()
    other = _instance("elsewhere", me, machine_id="m2/else")
    with pytest.raises(CommandError) as refused:
        cluster_start()
    message = str(refused.value)
    assert "\n" not in message and "host name" in message and "m2/else" in message
    assert not ClusterInstance.objects.exclude(pk=other.pk).exists()  # nothing written
    other.seen_at = now - timedelta(seconds=settings.LOOPSWEB_HOST_DEAD_SECONDS + 1)
    other.save()
    assert start_refusal(me, roots, now) is None  # silent that long: gone
    _instance("roots", me, roots=["/elsewhere"])
    assert "other project roots" in (start_refusal(me, roots, now) or "")
    ClusterInstance.objects.all().delete()
    _instance("sibling", me)  # a live cluster of this very machine, same roots
    assert start_refusal(me, roots, now) is None


def _route(project: str, n: int, **options: object) -> WorkflowRun:
    result = route_event(
        kind="generic",
        envelope=generic_event(project, n),
        options=route_options({"max_active": 5, **options}),
        env={},
    )
    assert result.kind == CREATED, result
    return result.run


def _host(name: str, *, age: float = 0) -> Host:
    host = Host.objects.create(
        name=name,
        queue=host_queue(name),
        roots=["/srv"],
        providers=["codewith"],
        workers=1,
        seen_at=timezone.now() - timedelta(seconds=age),
        projects=None,
    )
    hosts_read_forget()
    return host


def test_a_restarted_cluster_fails_its_dead_predecessors_claims_at_once() -> None:
    me = settings.LOOPSWEB_HOST_NAME
    _host(me)
    dead = _instance("gone0001", me, pid_namespace="pid:[1]")  # a previous container
    held = _route("/srv/p", 1, max_attempts=2, retry_backoff=0)
    worker = str(WorkerId(me, 4, dead.instance))
    assert run_claim(run_id=held.id, worker=worker) is not None
    instance = cluster_start()
    assert os.environ[INSTANCE_ENV] == instance != dead.instance
    run = WorkflowRun.objects.get(pk=held.id)
    assert run.status == RunStatus.FAILED and worker in (run.error or "")
    assert ClusterInstance.objects.get(pk=dead.pk).ended_at is not None
    retry = WorkflowRun.objects.exclude(pk=held.id).get(work_item_id=held.work_item_id)
    assert retry.status == RunStatus.QUEUED
    assert_account_counts_match_rows()


def test_a_dead_hosts_parked_run_ends_and_its_item_is_retried(admin_client) -> None:
    _host("host-a", age=settings.LOOPSWEB_HOST_DEAD_SECONDS + 5)
    _host("host-b")
    run = _route("/srv/p", 1, max_attempts=2, retry_backoff=0)
    worker = "host-a:7@00aa"
    assert run_claim(run_id=run.id, worker=worker) is not None
    WorkflowRun.objects.filter(pk=run.id).update(
        worktree_path="/w/x", worktree_branch="loopsweb/run-x", worktree_host="host-a"
    )
    assert run_park(run_id=run.id, worker=worker, resume_at=timezone.now())
    other = _route("/srv/p", 2)  # queued, on no host: left alone
    assert runs_end_on_gone_hosts() == [run.id]
    ended = WorkflowRun.objects.get(pk=run.id)
    assert ended.status == RunStatus.FAILED
    assert ended.error == HOST_GONE_ERROR.format(host="host-a")
    assert ended.lost_with_host == "host-a"
    assert WorkflowRun.objects.get(pk=other.id).status == RunStatus.QUEUED
    retry = WorkflowRun.objects.exclude(pk__in=[run.id, other.id]).get(
        work_item_id=run.work_item_id
    )
    assert retry.status == RunStatus.QUEUED and retry.worktree_path is None
    assert_account_counts_match_rows()
    assert runs_end_on_gone_hosts() == []
    html = admin_client.get(reverse("ops:hosts")).content.decode()
    assert 'id="lost-with-host"' in html and run.id in html
    assert "loopsweb/run-x" in html and "host-conflicts" not in html


def test_the_hosts_page_shows_a_name_two_machines_report_loudly(admin_client) -> None:
    _host("twice")
    _instance("one", "twice", machine_id="m1/a", roots=["/srv"])
    _instance("two", "twice", machine_id="m2/b", roots=["/srv"])
    html = admin_client.get(reverse("ops:hosts")).content.decode()
    assert 'id="host-conflicts"' in html and "m1/a" in html and "m2/b" in html
    assert "name conflict" in html


@pytest.mark.slow
def test_a_step_is_signalled_only_from_where_its_instance_runs() -> None:
    """`loop stop` on another machine that shares the host name (and, by chance, the pid)
    must not kill a stranger: only the instance's own process space signals it."""
    me = settings.LOOPSWEB_HOST_NAME
    elsewhere = _instance("far0001", me, machine_id="m2/else")
    here = _instance(
        "near0001", me, pid=1
    )  # another cluster of this machine and namespace
    stranger = subprocess.Popen(
        ["sleep", "600"], start_new_session=True, cwd=scratch_cwd()
    )
    try:
        step = make_step_run(
            status=StepStatus.RUNNING,
            pid=stranger.pid,
            started_at=timezone.now() - timedelta(seconds=5),
        )
        for worker in (
            f"{me}:{stranger.pid}",
            str(WorkerId(me, 4, elsewhere.instance)),
        ):
            assert not kill_step_process_group(step, claimed_by=worker)
            assert stranger.poll() is None, worker
        assert kill_step_process_group(
            step, claimed_by=str(WorkerId(me, 4, here.instance)), grace_seconds=5
        )
        assert stranger.wait(timeout=30) is not None
    finally:
        if stranger.poll() is None:
            stranger.kill()
            stranger.wait()


@pytest.mark.slow
def test_a_retry_after_its_host_was_gone_starts_from_the_work_on_the_lost_runs_branch(
    agent: FakeAgent, tmp_path: Path
) -> None:
    """The lost run's branch, where host A committed its worker's step (a project on
    storage both hosts see), is where the retry on this host starts: the agent finds the
    file, and the retry's branch carries it."""
    project = git_project(tmp_path / "repo")
    agent.env(write="note.txt")  # and list what the worktree holds
    for name, age in (("host-a", settings.LOOPSWEB_HOST_DEAD_SECONDS + 5), (None, 0)):
        name = name or settings.LOOPSWEB_HOST_NAME
        Host.objects.create(
            name=name,
            queue=host_queue(name),
            roots=[str(tmp_path)],
            providers=["codewith"],
            workers=1,
            seen_at=timezone.now() - timedelta(seconds=age),
            projects=None,
        )
    hosts_read_forget()
    first = route_generic(project, created=True, max_attempts=2, retry_backoff=0).run
    assert run_claim(run_id=first.id, worker="host-a:7@00aa") is not None
    branch = worktree_branch(first.id)
    scratch = tmp_path / "host-a-worktree"
    git(project, "worktree", "add", "-q", "-b", branch, str(scratch))
    (scratch / "partial.txt").write_text("the first half of the work\n")
    git(scratch, "add", "partial.txt")
    git(scratch, "commit", "-q", "-m", "step worker")
    git(project, "worktree", "remove", str(scratch))
    WorkflowRun.objects.filter(pk=first.id).update(
        worktree_path=str(worktree_dir(first.id)),
        worktree_branch=branch,
        worktree_host="host-a",
    )
    assert runs_end_on_gone_hosts() == [first.id]

    retry = WorkflowRun.objects.exclude(pk=first.id).get(
        work_item_id=first.work_item_id
    )
    assert run_workflow_run(retry.id) == RunStatus.SUCCEEDED
    assert '"partial.txt"' in steps_of(retry)["worker"].stdout
    retry_branch = worktree_branch(retry.id)
    assert git(project, "show", f"{retry_branch}:partial.txt") == (
        "the first half of the work\n"
    )
    # A plain run of another item starts from the project's HEAD, as before.
    other = route_generic(project, created=True).run
    assert run_workflow_run(other.id) == RunStatus.SUCCEEDED
    assert '"partial.txt"' not in steps_of(other)["worker"].stdout
