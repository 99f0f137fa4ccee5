"""Hosts known by what cannot repeat, and runs that never outlive their host (issue 43), as
real run qclusters against one PostgreSQL (tests/hostsim.py): a second run cluster under a
taken host name is refused; a cluster restarted in a fresh PID namespace (a container: its
qcluster is pid 1 again) fails what its predecessor held and runs what it had fetched at
once; a dead host's parked run ends and its item is retried on a live host."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections
from django.utils import timezone
from django_q.models import OrmQ

from ledger.hosts import host_queue, hosts_read_forget
from ledger.instances import WorkerId
from ledger.models import (
    AccountCooldown,
    ClusterInstance,
    Host,
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
)
from ledger.services import HOST_GONE_ERROR
from routing.admission import CREATED, route_event, route_options
from tests.account_loads import assert_account_counts_match_rows
from tests.hostsim import sim_host
from tests.ledger.runner_helpers import git_project
from tests.processes import MANAGE_PY, generic_event, scratch_cwd, wait_until
from tests.waiting import hang_deadline

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.postgres,
    # Minutes of dead-host and lease times like tests/test_hosts_process.py, on a worker of
    # their own beside those (one group of both was the suite's longest chain).
    pytest.mark.xdist_group("instances"),
]

AS_ROOT = os.geteuid() == 0 and shutil.which("unshare") is not None
ROOT_ONLY = pytest.mark.skipif(
    not AS_ROOT, reason="namespaces of its own (unshare) need root"
)


def _route(project: Path, n: int, **options: Any) -> str:
    result = route_event(
        kind="generic",
        envelope=generic_event(project, n),
        options=route_options({"max_active": 10, **options}),
        env={},
    )
    assert result.kind == CREATED, result
    return str(result.run.id)


def _instances(host: str) -> list[ClusterInstance]:
    close_old_connections()
    return list(ClusterInstance.objects.filter(host=host).order_by("created_at"))


def _live(host: str, n: int = 1) -> list[ClusterInstance]:
    def registered() -> list[ClusterInstance] | None:
        hosts_read_forget()
        found = _instances(host)
        ready = Host.objects.filter(name=host, workers__gt=0).exists()
        return found if ready and len(found) >= n else None

    return wait_until(registered, timeout=120, what=f"run cluster {n} of {host}")


def _claims() -> Counter[str]:
    return Counter(
        WorkflowEvent.objects.filter(event_type="claimed").values_list(
            "workflow_run_id", flat=True
        )
    )


def _refused(command: list[str], env: dict[str, str]) -> list[str]:
    """Run a second run cluster's start; its output lines (it must exit non-zero)."""
    done = subprocess.run(
        command,
        cwd=scratch_cwd(),
        env={**env, "Q_CLUSTER_NAME": "loopsweb-runs"},
        capture_output=True,
        text=True,
        timeout=hang_deadline(120),
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line]
    assert done.returncode == 1, (done.returncode, lines)
    return lines


def test_a_second_run_cluster_under_a_taken_host_name_is_refused(
    tmp_path: Path,
) -> None:
    first = sim_host(tmp_path, "twin", [tmp_path / "roots-1"], LOOPSWEB_RUN_WORKERS="1")
    # The same name on this machine with other roots, and (as root) on another machine
    # (another node name: another machine id) with the same roots.
    other_roots = sim_host(
        tmp_path / "b", "twin", [tmp_path / "roots-2"], LOOPSWEB_RUN_WORKERS="1"
    )
    other_machine = sim_host(
        tmp_path / "c", "twin", [tmp_path / "roots-1"], LOOPSWEB_RUN_WORKERS="1"
    )
    other_machine.node_name = "another-box"
    try:
        first.start()
        [running] = _live("twin")
        refusals = [_refused([sys.executable, MANAGE_PY, "qcluster"], other_roots.env)]
        if AS_ROOT:
            command = other_machine.namespaced(f"{shlex.quote(MANAGE_PY)} qcluster")
            refusals.append(_refused(command, other_machine.env))
        assert first.proc is not None and first.proc.poll() is None
        host = Host.objects.get(name="twin")
    finally:
        first.stop()
    for lines in refusals:
        # One clear line, no traceback, nothing started.
        assert len(lines) == 1, lines
        assert lines[0].startswith("CommandError: run cluster refused: host name twin")
    assert "other project roots" in refusals[0][0]
    if AS_ROOT:
        assert "on another machine" in refusals[1][0]
    # Nothing of the refused clusters was written: one instance, the first one's roots.
    assert [i.instance for i in _instances("twin")] == [running.instance]
    assert host.roots == [str(tmp_path / "roots-1")]
    assert host.instance == running.instance and host.machine_id == running.machine_id


@ROOT_ONLY
def test_a_cluster_restarted_in_a_fresh_pid_namespace_takes_over_at_once(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    records = tmp_path / "records"
    records.mkdir()
    # Far beyond the waits below: only the restart's take-over can end the held run and
    # start the fetched one in time (Q_RETRY, the other way, is 95 minutes).
    lease = 1800
    a = sim_host(
        tmp_path,
        "host-a",
        [shared],
        LOOPSWEB_RUN_WORKERS="1",
        LOOPSWEB_RUN_LEASE_SECONDS=str(lease),
        FAKE_AGENT_SLEEP="600",
        FAKE_AGENT_RECORD_DIR=str(records),
    )
    a.own_pids = True
    project = git_project(shared / "zeta")
    try:
        a.start()
        [before] = _live("host-a")
        assert before.pid == 1  # the qcluster is its namespace's first process
        opts = {"max_attempts": 2, "retry_backoff": 0}
        held = _route(project, 1, **opts)
        fetched = _route(project, 2, **opts)
        wait_until(
            lambda: WorkflowStepRun.objects.filter(
                workflow_run_id=held, status=StepStatus.RUNNING, pid__isnull=False
            ).exists(),
            timeout=120,
            what="host A to run the first run's step",
        )
        wait_until(
            lambda: (
                OrmQ.objects.filter(
                    key=host_queue("host-a"), lock__gt=timezone.now()
                ).count()
                == 2
            ),
            timeout=60,
            what="host A to fetch the second run too",
        )
        held_by = WorkerId.parse(WorkflowRun.objects.get(pk=held).claimed_by)
        a.kill()  # its namespace's first process: every process in it dies
        a.env["FAKE_AGENT_SLEEP"] = "1"
        a.start()  # back at once, in a fresh PID namespace: never seen dead
        [_, after] = _live("host-a", 2)

        def done() -> bool:
            close_old_connections()
            return not WorkflowRun.objects.filter(
                status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
            ).exists()

        wait_until(done, timeout=600, what="the held run's retry and the fetched run")
    finally:
        a.stop()
    assert held_by is not None and held_by.instance == before.instance
    assert after.pid == before.pid and after.instance != before.instance
    assert ClusterInstance.objects.get(pk=before.pk).ended_at is not None
    assert Host.objects.get(name="host-a").released_at is None  # never dead
    failed = WorkflowRun.objects.get(pk=held)
    assert failed.status == RunStatus.FAILED and str(held_by) in (failed.error or "")
    assert WorkflowRun.objects.get(pk=fetched).status == RunStatus.SUCCEEDED
    [retry] = WorkflowRun.objects.exclude(pk__in=[held, fetched])
    assert (
        retry.status == RunStatus.SUCCEEDED
        and retry.work_item_id == failed.work_item_id
    )
    retried_by = WorkerId.parse(retry.claimed_by)
    assert retried_by is not None and retried_by.instance == after.instance
    assert _claims()[fetched] == 1
    assert "fetched runs queued again" in a.log_text()
    assert_account_counts_match_rows()


def test_a_dead_hosts_parked_run_ends_and_its_item_runs_on_a_live_host(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    dead = 20  # seconds: a host is dead after this (the default is a minute)
    common = {
        "LOOPSWEB_RUN_WORKERS": "1",
        "LOOPSWEB_HOST_DEAD_SECONDS": str(dead),
        "LOOPSWEB_STEP_START_POLL_SECONDS": "5",
        "FAKE_AGENT_SLEEP": "1",
    }
    a = sim_host(tmp_path, "host-a", [shared], **common)
    b = sim_host(tmp_path, "host-b", [shared], **common)
    project = git_project(shared / "eta")
    parked = _route(project, 1, auth_profile="acct-1", max_attempts=2, retry_backoff=0)
    # The run's account cools down: it waits between steps, parked, holding no worker.
    AccountCooldown.objects.create(
        account_profile="acct-1",
        until=timezone.now() + timedelta(hours=1),
        reason="rate limited (test)",
    )
    started = [a.start()]
    try:
        _live("host-a")

        def is_parked() -> bool:
            close_old_connections()
            return WorkflowRun.objects.filter(
                pk=parked,
                status=RunStatus.RUNNING,
                claimed_by__isnull=True,
                worktree_host="host-a",
            ).exists()

        wait_until(is_parked, timeout=120, what="the run parked on host A")
        started.append(b.start())
        _live("host-b")
        a.kill()  # the machine is gone, with the run's worktree
        AccountCooldown.objects.all().delete()  # the account is free again

        def retried() -> WorkflowRun | None:
            close_old_connections()
            return (
                WorkflowRun.objects.filter(
                    work_item__workflow_run__isnull=False,
                    status=RunStatus.SUCCEEDED,
                )
                .exclude(pk=parked)
                .first()
            )

        retry = wait_until(retried, timeout=300, what="the item's retry on host B")
    finally:
        for host in started:
            if host.proc is not None and host.proc.poll() is None:
                host.stop()
    ended = WorkflowRun.objects.get(pk=parked)
    assert ended.status == RunStatus.FAILED
    assert ended.error == HOST_GONE_ERROR.format(host="host-a")
    assert ended.lost_with_host == "host-a"
    assert retry.work_item_id == ended.work_item_id and retry.host == "host-b"
    assert retry.worktree_host == "host-b"
    assert not WorkflowRun.objects.filter(
        status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
    ).exists()
    assert_account_counts_match_rows()
