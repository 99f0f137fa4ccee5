"""One heartbeat per host (runs.heartbeat): every worker reports its own row, one UPDATE a
beat; the host-level work (the host's row, the dead-host sweep, the projects check, the
forgetting of long-gone workers) is done by the one worker holding the host's duty lock,
and another takes the duty when that worker dies (the kernel drops its lock). The run
clusters' process tests (tests/test_hosts_process.py, tests/test_run_clusters.py) watch
the same work through real workers."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import RunWorker
from ledger.services.run_workers import (
    FORGET_AFTER,
    run_worker_report,
    run_workers_forget,
)
from runs.heartbeat import HostDuty


@pytest.fixture
def data_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path
    return tmp_path


def _release(duty: HostDuty) -> None:
    assert duty.fd is not None
    os.close(duty.fd)
    duty.fd = None


def test_one_worker_of_a_host_holds_its_duty_until_it_lets_go(data_dir: Path) -> None:
    first, second = HostDuty("m1"), HostDuty("m1")
    assert first.held() is True
    assert second.held() is False  # the same host: one duty
    assert first.held() is True  # kept for the worker's life
    _release(first)  # what the kernel does when the worker dies
    assert second.held() is True
    assert HostDuty("m2").held() is True  # another host's duty is its own
    lock = data_dir / "heartbeat-m1.lock"
    assert lock.exists() and (lock.stat().st_mode & 0o777) == 0o600


@pytest.mark.slow  # a child process
def test_a_duty_held_by_another_process_is_not_taken(data_dir: Path) -> None:
    """flock across processes, as between a cluster's workers: a child holds the lock
    until told to go; this process's worker stays off duty meanwhile."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
            str(data_dir / "heartbeat-m1.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert HostDuty("m1").held() is False
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert HostDuty("m1").held() is True  # its holder gone: the duty is free


def test_a_duty_that_cannot_be_locked_leaves_the_worker_on_duty(
    tmp_path: Path, settings: Any
) -> None:
    settings.DATA_DIR = tmp_path / "missing"  # no such directory: no lock file
    assert HostDuty("m1").held() is True  # as before the lock: every worker beats


@pytest.mark.django_db
def test_a_workers_beat_is_one_update_and_the_host_forgets_the_long_gone() -> None:
    now = timezone.now()
    run_worker_report(cluster="c", host="m1", pid=1, cluster_pid=9, now=now)
    run_worker_report(
        cluster="c", host="m1", pid=2, cluster_pid=9, now=now - FORGET_AFTER * 2
    )
    with CaptureQueriesContext(connection) as beat:
        run_worker_report(cluster="c", host="m1", pid=1, cluster_pid=9, now=now)
    sql = [q["sql"] for q in beat.captured_queries]
    assert len(sql) == 1 and sql[0].startswith("UPDATE"), sql
    assert RunWorker.objects.count() == 2  # a worker's beat forgets nothing
    assert run_workers_forget(now + timedelta(seconds=1)) == 1
    assert list(RunWorker.objects.values_list("pid", flat=True)) == [1]
