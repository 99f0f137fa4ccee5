"""/ops/ on run capacity: busy / total per run cluster, runs waiting too long, and warnings that
name the setting or process to change."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from ledger import services
from ledger.capacity import run_capacity
from ledger.models import RunWorker, WorkflowRun
from ledger.services.run_workers import run_worker_report
from tests.ledger.runner_helpers import admit_workflow, agent_step

pytestmark = pytest.mark.django_db


def _page(admin_client) -> str:
    response = admin_client.get(reverse("ops:overview"))
    assert response.status_code == 200
    return response.content.decode()


def test_busy_and_total_per_cluster_from_worker_reports_and_held_runs(
    tmp_path: Path,
) -> None:
    now = timezone.now()
    for pid in (11, 12, 13):
        run_worker_report(cluster="loopsweb-runs", host="m1", pid=pid, cluster_pid=10)
    for pid in (21, 22):
        run_worker_report(cluster="loopsweb-runs", host="m2", pid=pid, cluster_pid=20)
    # A worker gone quiet no longer counts.
    run_worker_report(
        cluster="loopsweb-runs",
        host="m2",
        pid=23,
        cluster_pid=20,
        now=now - timedelta(minutes=5),
    )
    for worker in ("m1:11", "m1:12", "m2:21"):
        run = admit_workflow([agent_step("worker", cwd=tmp_path, profile=None)])
        assert services.run_claim(run_id=run.id, worker=worker)

    capacity = run_capacity(now=now)

    rows = {(c.host, c.busy, c.workers) for c in capacity.clusters}
    assert rows == {("m1", 2, 3), ("m2", 1, 2)}
    assert (capacity.busy, capacity.workers) == (3, 5)
    # A report upserts: the same worker again is still one row.
    run_worker_report(cluster="loopsweb-runs", host="m1", pid=11, cluster_pid=10)
    assert RunWorker.objects.filter(host="m1", pid=11).count() == 1


def test_overview_warns_with_no_run_cluster_caps_over_workers_and_overdue_schedules(
    admin_client,
    settings,
) -> None:
    settings.LOOPSWEB_RUN_WORKERS = 8
    call_command(
        "schedule_drain",
        "nightly",
        "generic",
        "--every",
        "5m",
        "--max-active",
        "6",
        stdout=io.StringIO(),
    )
    call_command(
        "schedule_drain",
        "tasks",
        "todos-task",
        "--every",
        "5m",
        "--max-active",
        "4",
        stdout=io.StringIO(),
    )
    html = _page(admin_client)
    assert "No run cluster is running" in html
    assert (
        "The scheduled drains allow up to 10 active runs (nightly 6, tasks 4) but there "
        "are 8 run workers (LOOPSWEB_RUN_WORKERS on this machine)"
    ) in html
    assert "is overdue" not in html

    Schedule.objects.filter(name="nightly").update(
        next_run=timezone.now() - timedelta(minutes=10)
    )
    for pid in range(12):
        run_worker_report(cluster="loopsweb-runs", host="m1", pid=pid, cluster_pid=1)
    html = _page(admin_client)
    assert "Schedule nightly is overdue by 10 min" in html
    assert "is the main cluster (`python manage.py qcluster`) running?" in html
    # Twelve live workers: the caps (10) decide again; no run cluster warning.
    assert "allow up to" not in html and "No run cluster is running" not in html
    assert "0 / 12" in html

    call_command(
        "schedule_drain", "open", "generic", "--every", "5m", stdout=io.StringIO()
    )
    assert "Scheduled drain open has no --max-active" in _page(admin_client)


def test_overview_shows_runs_waiting_more_than_two_minutes(
    admin_client,
    tmp_path: Path,
) -> None:
    fresh = admit_workflow([agent_step("worker", cwd=tmp_path, profile=None)])
    old = admit_workflow([agent_step("worker", cwd=tmp_path, profile=None)])
    WorkflowRun.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(minutes=3)
    )
    assert run_capacity(now=timezone.now()).waiting == 1
    html = _page(admin_client)
    assert "1 run(s) have waited more than 2 minutes for a run worker" in html
    assert fresh.status == "queued"
