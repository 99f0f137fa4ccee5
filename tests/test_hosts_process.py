"""Several machines, one ledger (issue 27), as real processes against one PostgreSQL: each
simulated host is a run qcluster with its own LOOPSWEB_HOST_NAME, data directory, worktree
directory and project roots; one main qcluster runs the schedules (lease recovery, the
no-host grace, prune). The agent is scripts/fake-agent."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections
from django.utils import timezone
from django_q.models import OrmQ
from django_q.tasks import async_task

from domain.errors import ValidationError
from ledger.hosts import host_queue, hosts_read_forget
from ledger.models import (
    Host,
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from ledger.queue import RUN_TASK, run_id_of
from ledger.services import HOST_GONE_ERROR, runs_fail_unserved
from routing.admission import CREATED, route_event, route_options
from tests.account_loads import assert_account_counts_match_rows
from tests.hostsim import SimHost, main_cluster, sim_host
from tests.ledger.runner_helpers import git, git_project
from tests.processes import generic_event, manage, stop_process_group, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.postgres,
    # The longest tests of the PostgreSQL suite (a dead host takes minutes): one worker runs
    # them from the start, beside the other groups (tests/conftest.py, GROUP_ORDER).
    pytest.mark.xdist_group("hosts"),
]


def _route(project: Path, n: int, **options: Any) -> str:
    result = route_event(
        kind="generic",
        envelope=generic_event(project, n),
        options=route_options({"max_active": 50, **options}),
        env={},
    )
    assert result.kind == CREATED, result
    return str(result.run.id)


def _registered(*names: str) -> None:
    wait_until(
        lambda: set(Host.objects.values_list("name", flat=True)) >= set(names),
        timeout=90,
        what=f"hosts {names} to register",
    )
    hosts_read_forget()


def _has(host: str, *projects: Path) -> bool:
    """Whether `host` has recorded that it has every one of `projects` (ledger.hosts)."""
    found = Host.objects.filter(name=host).values_list("projects", flat=True).first()
    return all((found or {}).get(str(p)) is True for p in projects)


def _queued_runs() -> set[str]:
    """Runs with a task in the broker."""
    return {
        r for p in OrmQ.objects.values_list("payload", flat=True) if (r := run_id_of(p))
    }


def _claims() -> Counter[str]:
    return Counter(
        WorkflowEvent.objects.filter(event_type="claimed").values_list(
            "workflow_run_id", flat=True
        )
    )


def _records(records: Path) -> list[dict[str, Any]]:
    return [json.loads(f.read_text()) for f in records.glob("*.json")]


def test_runs_go_to_the_hosts_that_serve_their_project_and_wait_for_none(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"  # the same clone path on both machines
    records = tmp_path / "records"
    records.mkdir()
    common = {
        "LOOPSWEB_RUN_WORKERS": "2",
        "FAKE_AGENT_SLEEP": "0.5",
        "FAKE_AGENT_RECORD_DIR": str(records),
        # Neither machine has codex: a codex route is refused, or (admitted while a host
        # with codex for other projects lives) waits for a host, then fails.
        "LOOPSWEB_CODEX_BIN": str(tmp_path / "no-such-codex"),
    }
    a = sim_host(
        tmp_path, "host-a", [tmp_path / "host-a" / "projects", shared], **common
    )
    b = sim_host(
        tmp_path, "host-b", [tmp_path / "host-b" / "projects", shared], **common
    )
    only_a = git_project(a.roots[0] / "alpha")
    both = git_project(shared / "beta")
    grace = 20
    manage(a.env, "sync_schedules")
    main = main_cluster(tmp_path, LOOPSWEB_NO_HOST_GRACE_SECONDS=str(grace))
    hosts = [a.start(), b.start()]
    try:
        _registered("host-a", "host-b")
        host = Host.objects.get(name="host-a")
        assert host.queue == host_queue("host-a")
        assert str(only_a.parent) in host.roots and "codewith" in host.providers
        assert "codex" not in host.providers

        # Admission: a project under no host's roots is refused, naming the hosts' roots.
        with pytest.raises(ValidationError, match="no registered host serves"):
            _route(tmp_path / "elsewhere" / "p", 0)
        # A project no host has checked yet: its first run waits until the hosts have
        # looked at their disks (a heartbeat), then runs go only where the project is.
        alpha, beta = [_route(only_a, 400)], [_route(both, 401)]
        wait_until(
            lambda: _has("host-a", only_a, both) and _has("host-b", both),
            timeout=60,
            what="the hosts to check their disks for the projects",
        )
        alpha += [_route(only_a, n) for n in range(5)]
        beta += [_route(both, 100 + n) for n in range(9)]
        # No live host has codex: a codex route is refused at admission, naming it.
        with pytest.raises(ValidationError, match="no live host serves provider codex"):
            _route(both, 199, provider="codex")
        # A machine that has codex, for other projects only (a row, no process: it goes
        # dead later and nothing is queued for it): admitted, the run waits for a host.
        Host.objects.create(
            name="host-c",
            queue=host_queue("host-c"),
            roots=[str(tmp_path / "host-c" / "projects")],
            providers=["codex"],
            workers=1,
            seen_at=timezone.now(),
        )
        hosts_read_forget()
        codex = _route(both, 200, provider="codex")
        # A run put straight into host B's queue for host A's project: B hands it back.
        stray = _route(only_a, 300)
        moved = set()
        for row in OrmQ.objects.filter(key=host_queue("host-a")):
            if run_id_of(row.payload) in (*alpha, stray) and row.lock <= timezone.now():
                # Not fetched by A yet: it goes to B instead, which cannot serve it.
                if OrmQ.objects.filter(pk=row.pk, lock=row.lock).delete()[0]:
                    moved.add(run_id_of(row.payload))
        for run_id in moved:
            async_task(RUN_TASK, run_id, cluster=host_queue("host-b"))
        assert stray in moved or WorkflowRun.objects.get(pk=stray).host == "host-a"

        waiting = wait_until(
            lambda: WorkflowRun.objects.filter(
                pk=codex, host_wait_reason__isnull=False
            ).first(),
            timeout=30,
            what="the codex run to say why it waits",
        )
        assert waiting.host_wait_reason == f"no host serves {both} for codex"
        assert waiting.status == RunStatus.QUEUED

        def settled() -> bool:
            assert all(h.proc and h.proc.poll() is None for h in hosts), "a host died"
            return not WorkflowRun.objects.filter(
                id__in=[*alpha, *beta, stray],
                status__in=[RunStatus.QUEUED, RunStatus.RUNNING],
            ).exists()

        wait_until(settled, timeout=240, what="the served runs to finish")
        failed = wait_until(
            lambda: WorkflowRun.objects.filter(
                pk=codex, status=RunStatus.FAILED
            ).first(),
            timeout=grace + 150,
            what="the codex run to fail after the grace",
        )
    finally:
        for h in hosts:
            h.stop()
        stop_process_group(main)

    runs = {r.id: r for r in WorkflowRun.objects.all()}
    assert {runs[r].status for r in [*alpha, *beta, stray]} == {RunStatus.SUCCEEDED}
    assert {runs[r].host for r in [*alpha, stray]} == {"host-a"}, "alpha ran off host-a"
    per_host = Counter(runs[r].host for r in beta)
    assert set(per_host) == {"host-a", "host-b"}, per_host
    assert moved and all(runs[r].host == "host-a" for r in moved)
    assert failed.error and f"no host serves {both} for codex" in failed.error
    assert failed.host is None and failed.started_at is None
    # The failed codex run's wait lasted the grace, not less.
    assert failed.finished_at - failed.host_wait_since >= timedelta(seconds=grace)
    item = WorkflowWorkItem.objects.get(workflow_run_id=codex)
    assert item.status == "failed"
    # Each run claimed once, each step's agent started once, on the host of its run.
    assert _claims() == dict.fromkeys([*alpha, *beta, stray], 1)
    starts = Counter(
        (r["env"].get("LOOPSWEB_RUN_ID"), r["env"].get("LOOPSWEB_STEP_ID"))
        for r in _records(records)
    )
    assert set(starts.values()) == {1}
    assert {run_id for run_id, _ in starts} == {*alpha, *beta, stray}
    assert_account_counts_match_rows()
    # Each run's worktree was made on its host, under that host's worktree directory.
    for run_id in [*alpha, *beta]:
        run = runs[run_id]
        assert run.worktree_host == run.host
        assert run.worktree_path.startswith(str(tmp_path / run.host / "worktrees"))


def _sampler(cap: int, samples: list[tuple[float, int, int]]) -> None:
    close_old_connections()
    active = WorkflowWorkItem.objects.filter(
        status__in=["admitted", "queued", "running"]
    ).count()
    running = WorkflowStepRun.objects.filter(status=StepStatus.RUNNING).count()
    assert active <= cap, f"{active} active work items over the cap {cap}"
    assert_account_counts_match_rows()
    samples.append((time.monotonic(), active, running))


def test_a_killed_hosts_fetched_run_runs_elsewhere_within_two_minutes(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    records = tmp_path / "records"
    records.mkdir()
    lease = 30
    # A host is dead after 20 s here, not the default minute: the move is timed against it.
    dead = 20
    a = sim_host(
        tmp_path,
        "host-a",
        [shared],
        LOOPSWEB_RUN_WORKERS="1",
        LOOPSWEB_RUN_LEASE_SECONDS=str(lease),
        LOOPSWEB_HOST_DEAD_SECONDS=str(dead),
        FAKE_AGENT_SLEEP="600",  # the run A holds never ends by itself
        FAKE_AGENT_RECORD_DIR=str(records),
    )
    b = sim_host(
        tmp_path,
        "host-b",
        [shared],
        LOOPSWEB_RUN_WORKERS="2",
        LOOPSWEB_RUN_LEASE_SECONDS=str(lease),
        LOOPSWEB_HOST_DEAD_SECONDS=str(dead),
        FAKE_AGENT_SLEEP="1",
        FAKE_AGENT_RECORD_DIR=str(records),
    )
    project = git_project(shared / "gamma")
    manage(a.env, "sync_schedules")
    main = main_cluster(
        tmp_path,
        LOOPSWEB_RUN_LEASE_SECONDS=str(lease),
        LOOPSWEB_HOST_DEAD_SECONDS=str(dead),
    )
    hosts: list[SimHost] = [a.start()]
    cap = 3
    samples: list[tuple[float, int, int]] = []
    try:
        _registered("host-a")
        # The retry waits 1 s, not the default minute: the retry is not what this test times.
        opts = {
            "max_active": cap,
            "auth_profile": "acct-1",
            "max_attempts": 2,
            "retry_backoff": 1,
        }
        held = _route(project, 1, **opts)
        fetched = _route(project, 2, **opts)
        # A runs the first (its one worker) and has fetched the second from its queue.
        wait_until(
            lambda: WorkflowStepRun.objects.filter(
                workflow_run_id=held, status=StepStatus.RUNNING, pid__isnull=False
            ).exists(),
            timeout=90,
            what="host A to run the first run's step",
        )
        wait_until(
            lambda: (
                OrmQ.objects.filter(
                    key=host_queue("host-a"), lock__gt=timezone.now()
                ).count()
                == 2
            ),
            timeout=30,
            what="host A to fetch the second run too",
        )
        assert WorkflowRun.objects.get(pk=fetched).status == RunStatus.QUEUED
        hosts.append(b.start())
        _registered("host-b")
        _sampler(cap, samples)
        # The machine dies: its cluster and the agent it was running, all SIGKILLed.
        step_pid = WorkflowStepRun.objects.get(
            workflow_run_id=held, status=StepStatus.RUNNING
        ).pid
        a.kill()
        os.killpg(step_pid, signal.SIGKILL)
        killed = time.monotonic()

        def fetched_running_on_b() -> bool:
            _sampler(cap, samples)
            run = WorkflowRun.objects.get(pk=fetched)
            return run.host == "host-b" and run.status != RunStatus.QUEUED

        wait_until(fetched_running_on_b, timeout=150, what="the fetched run on B")
        moved_after = time.monotonic() - killed

        def held_failed() -> WorkflowRun | None:
            _sampler(cap, samples)
            return WorkflowRun.objects.filter(pk=held, status=RunStatus.FAILED).first()

        failed = wait_until(
            held_failed, timeout=lease + 150, what="the held run to fail"
        )
        failed_after = time.monotonic() - killed

        def all_done() -> bool:
            _sampler(cap, samples)
            return not WorkflowRun.objects.filter(
                status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
            ).exists()

        wait_until(
            all_done, timeout=180, what="the fetched run and the retry to finish"
        )
    finally:
        for h in hosts:
            if h.proc is not None and h.proc.poll() is None:
                h.stop()
        stop_process_group(main)

    print(
        f"fetched run on B after {moved_after:.0f} s; held run failed after {failed_after:.0f} s"
    )
    # The fetched run moved because B found A dead (not after Q_RETRY, 95 minutes, which is
    # what the hang deadline above rules out): A was declared dead once its last heartbeat
    # was `dead` s old, not sooner, and the run started on B after that. How soon is the
    # hosts benchmark's question (tests/bench/), not this test's.
    host_a = Host.objects.get(name="host-a")
    moved = WorkflowRun.objects.get(pk=fetched)
    assert host_a.released_at is not None and moved.started_at is not None
    assert host_a.released_at - host_a.seen_at >= timedelta(seconds=dead)
    assert host_a.released_at <= moved.started_at
    # A's run ended when A was found dead (sooner than its lease): its worktree stayed there.
    assert failed.error == HOST_GONE_ERROR.format(host="host-a")
    assert failed.lost_with_host == "host-a"
    runs = list(WorkflowRun.objects.all())
    retry = [r for r in runs if r.id not in (held, fetched)]
    assert len(retry) == 1 and retry[0].status == RunStatus.SUCCEEDED
    assert retry[0].host == "host-b"
    assert WorkflowRun.objects.get(pk=fetched).status == RunStatus.SUCCEEDED
    # Nothing ran twice: each run claimed once, each step's agent started once per run.
    assert set(_claims().values()) == {1}
    starts = Counter(
        (r["env"].get("LOOPSWEB_RUN_ID"), r["env"].get("LOOPSWEB_STEP_ID"))
        for r in _records(records)
    )
    assert set(starts.values()) == {1}, starts
    assert len(samples) >= 30  # sampled about every second, each checked
    assert Host.objects.get(name="host-a").released_at is not None


def test_each_host_prunes_only_the_worktrees_it_made(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    common = {"LOOPSWEB_RUN_WORKERS": "2", "FAKE_AGENT_EXIT": "3"}  # runs fail: kept
    a = sim_host(tmp_path, "host-a", [shared / "a"], **common)
    b = sim_host(tmp_path, "host-b", [shared / "b"], **common)
    on_a = git_project(shared / "a" / "delta")
    manage(a.env, "sync_schedules")
    hosts = [a.start(), b.start()]
    try:
        _registered("host-a", "host-b")
        runs = [_route(on_a, n) for n in range(3)]
        wait_until(
            lambda: (
                WorkflowRun.objects.filter(id__in=runs, status=RunStatus.FAILED).count()
                == 3
            ),
            timeout=120,
            what="host A's runs to fail (their worktrees kept)",
        )
    finally:
        for h in hosts:
            h.stop()
    kept = {r.id: r for r in WorkflowRun.objects.filter(id__in=runs)}
    assert {r.worktree_host for r in kept.values()} == {"host-a"}
    # An orphan on A's disk: a worktree (and branch) of a run the ledger does not have.
    orphan_id = "0" * 32
    git(
        on_a,
        "worktree",
        "add",
        "-q",
        "-b",
        f"loopsweb/run-{orphan_id}",
        str(a.worktrees / orphan_id),
        "HEAD",
    )

    pruned_b = json.loads(
        manage(
            b.env, "prune_worktrees", "--keep-seconds", "0", "--orphans", "--json"
        ).stdout
    )
    assert pruned_b["pruned"] == []
    assert not WorkflowRun.objects.filter(
        id__in=runs, worktree_removed_at__isnull=False
    ).exists()
    assert all(Path(r.worktree_path).is_dir() for r in kept.values())

    pruned_a = json.loads(
        manage(
            a.env, "prune_worktrees", "--keep-seconds", "0", "--orphans", "--json"
        ).stdout
    )
    assert {p["runId"] for p in pruned_a["pruned"]} == {*runs, orphan_id}
    assert all(p["error"] is None for p in pruned_a["pruned"])
    assert (
        WorkflowRun.objects.filter(
            id__in=runs, worktree_removed_at__isnull=False
        ).count()
        == 3
    )
    assert not any(Path(r.worktree_path).exists() for r in kept.values())
    assert not (a.worktrees / orphan_id).exists()
    branches = git(on_a, "branch", "--list", "loopsweb/run-*")
    assert branches.strip() == "", branches


def test_a_host_restarted_at_once_runs_what_its_killed_cluster_had_fetched(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    records = tmp_path / "records"
    records.mkdir()
    lease = 30
    a = sim_host(
        tmp_path,
        "host-a",
        [shared],
        LOOPSWEB_RUN_WORKERS="1",
        LOOPSWEB_RUN_LEASE_SECONDS=str(lease),
        FAKE_AGENT_SLEEP="600",
        FAKE_AGENT_RECORD_DIR=str(records),
    )
    project = git_project(shared / "epsilon")
    try:
        a.start()
        _registered("host-a")
        held = _route(project, 1)
        fetched = _route(project, 2)
        wait_until(
            lambda: WorkflowStepRun.objects.filter(
                workflow_run_id=held, status=StepStatus.RUNNING, pid__isnull=False
            ).exists(),
            timeout=90,
            what="host A to run the first run's step",
        )
        wait_until(
            lambda: (
                OrmQ.objects.filter(
                    key=host_queue("host-a"), lock__gt=timezone.now()
                ).count()
                == 2
            ),
            timeout=30,
            what="host A to fetch the second run too",
        )
        step_pid = WorkflowStepRun.objects.get(
            workflow_run_id=held, status=StepStatus.RUNNING
        ).pid
        a.kill()
        os.killpg(step_pid, signal.SIGKILL)
        killed = time.monotonic()
        a.env["FAKE_AGENT_SLEEP"] = "1"
        a.start()  # the same machine, back at once: never seen dead
        wait_until(
            lambda: WorkflowRun.objects.filter(
                pk=fetched, status=RunStatus.SUCCEEDED
            ).exists(),
            # A hang deadline, far below Q_RETRY (95 minutes): the wait had the fetched
            # task been lost with the killed cluster.
            timeout=600,
            what="the fetched run to run on the restarted host",
        )
        restarted_after = time.monotonic() - killed
    finally:
        a.stop()
    print(f"fetched run done {restarted_after:.0f} s after the kill and restart")
    assert Host.objects.get(name="host-a").released_at is None  # never dead
    assert _claims()[fetched] == 1
    assert "previous run cluster had fetched" in a.log_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace per host needs root")
def test_identical_roots_different_checkouts_place_without_hand_backs(
    tmp_path: Path,
) -> None:
    """Both hosts serve the root /…/work, but each has its own disk mounted there (a mount
    namespace per host): the clone zeta is only on host A's, and nowhere is on no disk.
    Placement knows the checkout: zeta's runs go to A with no hand-back, and the run for
    nowhere waits "no host has …" (0 hand-backs) and fails after the grace."""
    work = tmp_path / "work"  # the path both hosts serve; each sees its own disk there
    work.mkdir()
    disk_a, disk_b = tmp_path / "disk-a", tmp_path / "disk-b"
    disk_b.mkdir()
    git_project(disk_a / "zeta")
    common = {"LOOPSWEB_RUN_WORKERS": "2", "FAKE_AGENT_SLEEP": "0.2"}
    a = sim_host(tmp_path, "host-a", [work], **common)
    b = sim_host(tmp_path, "host-b", [work], **common)
    a.binds, b.binds = {disk_a: work}, {disk_b: work}
    hosts = [a.start(), b.start()]
    nowhere = work / "nowhere"
    try:
        _registered("host-a", "host-b")
        runs = [_route(work / "zeta", n) for n in range(10)]
        lost = _route(nowhere, 99)
        wait_until(
            lambda: (
                not WorkflowRun.objects.filter(
                    id__in=runs, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
                ).exists()
            ),
            timeout=180,
            what="the runs to finish",
        )
        waiting = wait_until(
            lambda: WorkflowRun.objects.filter(
                pk=lost, host_wait_reason=f"no host has {nowhere}"
            ).first(),
            timeout=60,
            what="the run for a project no host has to say why it waits",
        )
        assert waiting.status == RunStatus.QUEUED and lost not in _queued_runs()
        # The grace (LOOPSWEB_NO_HOST_GRACE_SECONDS; the recovery schedule's call).
        assert runs_fail_unserved(grace=timedelta(seconds=0)) == [lost]
    finally:
        for h in hosts:
            h.stop()
    done = list(WorkflowRun.objects.filter(id__in=runs))
    assert {r.status for r in done} == {RunStatus.SUCCEEDED}, [r.error for r in done]
    assert {r.host for r in done} == {"host-a"}
    assert _claims() == dict.fromkeys(runs, 1)
    failed = WorkflowRun.objects.get(pk=lost)
    assert (
        failed.status == RunStatus.FAILED and f"no host has {nowhere}" in failed.error
    )
    for h in hosts:  # no host was ever handed a run it could not serve
        assert "handed back" not in h.log_text()
    assert _has("host-a", work / "zeta") and not _has("host-b", work / "zeta")
