"""Health without login and without data. `GET /healthz` (and `/readyz`): this web process and
its database only, 200 whatever the clusters do. `GET /health/installation` and `manage.py
health`: 200 only when the database answers and both clusters reported within their
interval, 503 naming what is wrong otherwise. `GET /livez`: the process answers."""

from __future__ import annotations

import io
import json
import os
import uuid
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone
from django_q.models import Task

from ledger.services.run_workers import run_worker_report
from routing.ops.health.selectors import (
    MAIN_CLUSTER_PROBE,
    MAIN_CLUSTER_WITHIN,
    RUN_CLUSTER_WITHIN,
    health_report,
)
from tests.processes import free_port, manage

pytestmark = pytest.mark.django_db

HOST = "secret-host.internal"


def _main_cluster_finished(at: datetime, *, cluster: str = "loopsweb") -> None:
    Task.objects.create(
        id=uuid.uuid4().hex,
        name=f"probe-{uuid.uuid4().hex[:8]}",
        func="runs.tasks.recover_expired_runs",
        started=at - timedelta(seconds=1),
        stopped=at,
        success=True,
        group=MAIN_CLUSTER_PROBE,
        cluster=cluster,
    )


def _run_worker_reported(at: datetime, pid: int = 4242) -> None:
    run_worker_report(
        cluster="loopsweb-runs", host=HOST, pid=pid, cluster_pid=4000, now=at
    )


INSTALLATION = "/health/installation"


def _get(client: Client, url: str = INSTALLATION) -> tuple[int, dict]:
    response = client.get(url)
    assert response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"]
    return response.status_code, json.loads(response.content)


def test_nothing_reported_is_503_naming_both_clusters() -> None:
    status, body = _get(Client())
    assert status == 503
    assert body["database"] == "ok"
    assert body["status"] == "unhealthy"
    assert body["clusters"]["loopsweb"]["status"] == "not reporting"
    assert body["clusters"]["loopsweb-runs"]["status"] == "not reporting"
    assert body["clusters"]["loopsweb-runs"]["workers"] == 0
    assert body["problems"] == [
        "cluster loopsweb has never reported",
        "cluster loopsweb-runs has never reported",
    ]


def test_both_clusters_fresh_is_200_without_login_and_without_host_names() -> None:
    now = timezone.now()
    _main_cluster_finished(now - timedelta(seconds=20))
    _run_worker_reported(now - timedelta(seconds=3))
    _run_worker_reported(now - timedelta(seconds=4), pid=4243)
    response = Client().get(INSTALLATION)
    assert response.status_code == 200
    body = json.loads(response.content)
    assert body["status"] == "ok"
    assert body["database"] == "ok"
    assert body["clusters"]["loopsweb"]["status"] == "ok"
    assert 19 <= body["clusters"]["loopsweb"]["last_seen_seconds_ago"] <= 60
    assert body["clusters"]["loopsweb-runs"] == {
        "status": "ok",
        "interval_seconds": int(RUN_CLUSTER_WITHIN.total_seconds()),
        "last_seen_seconds_ago": body["clusters"]["loopsweb-runs"][
            "last_seen_seconds_ago"
        ],
        "workers": 2,
    }
    assert "problems" not in body
    text = response.content.decode()
    assert HOST not in text and "4242" not in text


def test_a_run_cluster_gone_quiet_is_503_and_the_main_cluster_still_ok() -> None:
    now = timezone.now()
    _main_cluster_finished(now - timedelta(seconds=5))
    _run_worker_reported(now - RUN_CLUSTER_WITHIN - timedelta(seconds=1))
    status, body = _get(Client())
    assert status == 503
    assert body["clusters"]["loopsweb"]["status"] == "ok"
    assert body["clusters"]["loopsweb-runs"]["status"] == "not reporting"
    assert body["problems"] == [
        f"cluster loopsweb-runs has not reported within {int(RUN_CLUSTER_WITHIN.total_seconds())} s"
    ]


def test_main_cluster_counts_only_its_own_successful_probe_within_the_interval() -> (
    None
):
    now = timezone.now()
    _run_worker_reported(now)
    # too old, run by the other cluster, another task, or failed: none shows the main
    # cluster at work
    _main_cluster_finished(now - MAIN_CLUSTER_WITHIN - timedelta(seconds=1))
    _main_cluster_finished(now, cluster="loopsweb-runs")
    Task.objects.create(
        id=uuid.uuid4().hex,
        name="drain",
        func="routing.tasks.drain",
        started=now,
        stopped=now,
        success=True,
        group="some-drain",
        cluster="loopsweb",
    )
    Task.objects.create(
        id=uuid.uuid4().hex,
        name="failed-probe",
        func="runs.tasks.recover_expired_runs",
        started=now,
        stopped=now,
        success=False,
        group=MAIN_CLUSTER_PROBE,
        cluster="loopsweb",
    )
    report = health_report(now=now)
    assert not report.healthy
    assert report.problems == [
        f"cluster loopsweb has not reported within {int(MAIN_CLUSTER_WITHIN.total_seconds())} s"
    ]
    _main_cluster_finished(now - MAIN_CLUSTER_WITHIN + timedelta(seconds=5))
    assert health_report(now=now).healthy


def test_healthz_and_readyz_are_200_while_no_cluster_has_ever_reported() -> None:
    # A web machine whose clusters are down still serves: the load balancer keeps it.
    assert not health_report().healthy
    for url in ("/healthz", "/readyz"):
        status, body = _get(Client(), url)
        assert (status, body) == (200, {"status": "ok", "database": "ok"}), url
    assert _get(Client(), INSTALLATION)[0] == 503
    assert _get(Client(), "/livez") == (200, {"status": "ok"})


def test_healthz_does_not_read_the_clusters(django_assert_num_queries) -> None:
    with django_assert_num_queries(1):  # SELECT 1
        assert Client().get("/healthz").status_code == 200
    with django_assert_num_queries(0):
        assert Client().get("/livez").status_code == 200


def test_only_get_and_head() -> None:
    for url in ("/healthz", "/readyz", "/livez", INSTALLATION):
        assert Client().post(url).status_code == 405, url
    assert Client().head("/healthz").status_code == 200
    assert Client().head(INSTALLATION).status_code == 503


def test_health_command_prints_the_same_and_exits_nonzero_when_unhealthy() -> None:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="unhealthy"):
        call_command("health", "--json", stdout=out, stderr=err)
    body = json.loads(out.getvalue())
    assert body["status"] == "unhealthy"
    assert "cluster loopsweb has never reported" in body["problems"]

    now = timezone.now()
    _main_cluster_finished(now)
    _run_worker_reported(now)
    out = io.StringIO()
    call_command("health", stdout=out)  # healthy: returns, no CommandError
    text = out.getvalue()
    assert "status: ok" in text
    assert "database: ok" in text
    assert "cluster loopsweb-runs: ok" in text and "1 live workers" in text


@pytest.mark.slow
def test_health_command_when_the_database_does_not_answer(tmp_path) -> None:
    # A real process on a PostgreSQL port nobody listens on: no database to answer.
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://loopsweb:pw@127.0.0.1:{free_port()}/none",
        "LOOPSWEB_DATA_DIR": str(tmp_path),
    }
    done = manage(env, "health", "--json", check=False)
    assert done.returncode == 1, done.stderr
    body = json.loads(done.stdout)
    assert body["database"] == "unavailable"
    assert body["problems"] == ["the database does not answer"]
    assert {c["status"] for c in body["clusters"].values()} == {"unknown"}
    assert "127.0.0.1" not in done.stdout  # the error text is logged, not reported


def test_a_plain_http_probe_is_not_redirected_when_https_is_on(settings) -> None:
    # Behind TLS, a load balancer probes the backend port over plain HTTP: /healthz answers
    # there, every other page still redirects to HTTPS.
    settings.SECURE_SSL_REDIRECT = True
    assert Client().get("/admin/login/").status_code == 301
    assert Client().get("/ops/").status_code == 301
    assert Client().get("/healthz").status_code == 200
    assert Client().get("/readyz").status_code == 200
    assert Client().get("/livez").status_code == 200
    assert Client().get(INSTALLATION).status_code == 503


def test_nothing_else_is_open_without_login() -> None:
    now = timezone.now()
    _main_cluster_finished(now)
    _run_worker_reported(now)
    assert Client().get(INSTALLATION).status_code == 200
    assert Client().get("/ops/").status_code == 302  # to the login
    assert Client().get("/admin/").status_code == 302
    assert Client().get("/healthz/").status_code == 404
    assert Client().get("/health/").status_code == 404
