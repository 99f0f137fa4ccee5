"""Hosts (ledger.hosts, ledger.queue): placement by roots and provider, the shared queue with
no host registered, a dead host's queue emptied into the live ones, the no-host grace, the
admission check against every registered host's roots, and the settings' bounds."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from django_q.models import OrmQ

from domain.errors import ValidationError
from domain.events import parse_envelope
from ledger.hosts import (
    host_queue,
    host_report,
    hosts_read_forget,
    run_placement,
)
from ledger.models import Host, RunStatus, WorkflowRun
from ledger.queue import (
    enqueue_run,
    hand_back_elsewhere,
    host_projects_refresh,
    hosts_release_dead,
    run_id_of,
    runs_with_a_task,
)
from ledger.services import runs_fail_unserved
from routing.admission import (
    CREATED,
    RoutePlan,
    plan_reads,
    plan_route,
    route_event,
    route_options,
)
from routing.drains.routable import never_routes
from tests.account_loads import assert_account_counts_match_rows
from tests.processes import ROOT, generic_event, scratch_cwd

pytestmark = pytest.mark.django_db


def _host(
    name: str,
    roots: list[str],
    providers: list[str],
    *,
    age: float = 0,
    projects: dict[str, bool] | None = None,
) -> Host:
    """A registered host; `projects` None: a host that never says which it has (roots)."""
    host = Host.objects.create(
        name=name,
        queue=host_queue(name),
        roots=roots,
        providers=providers,
        workers=2,
        seen_at=timezone.now() - timedelta(seconds=age),
        projects=projects,
    )
    hosts_read_forget()
    return host


def _route(path: str, n: int, **options: object) -> str:
    result = route_event(
        kind="generic",
        envelope=generic_event(Path(path), n),
        options=route_options({"max_active": 100, **options}),
        env={},
    )
    assert result.kind == CREATED, result
    return str(result.run.id)


def _queues() -> dict[str, str]:
    """run id -> the queue its task is in."""
    return {
        str(run_id_of(row.payload)): row.key
        for row in OrmQ.objects.all()
        if run_id_of(row.payload)
    }


def test_with_no_host_registered_runs_go_to_the_shared_queue() -> None:
    run = _route("/srv/p", 1)
    assert _queues()[run] == settings.LOOPSWEB_RUN_CLUSTER


def test_a_run_goes_to_a_live_host_that_has_its_project_and_provider() -> None:
    _host("a", ["/srv/a"], ["codewith"])
    _host("b", ["/srv"], ["codewith", "codex"])
    _host("gone", ["/srv"], ["codewith", "codex"], age=3600)
    only_b = _route("/srv/b/p", 1)
    codex = _route("/srv/a/p", 2, provider="codex")
    assert _queues()[only_b] == host_queue("b")
    assert _queues()[codex] == host_queue("b")
    spread_runs = [_route("/srv/a/q", 10 + n) for n in range(8)]
    spread = {_queues()[run_id] for run_id in spread_runs}
    assert spread == {host_queue("a"), host_queue("b")}  # fewest tasks per worker


def test_a_run_no_live_host_serves_waits_with_its_reason_then_fails_after_the_grace() -> (
    None
):
    _host("a", ["/srv"], ["codewith"])
    _host("c", ["/other"], ["codex"])  # codex is served (admission), not for /srv/p
    run_id = _route("/srv/p", 1, provider="codex", auth_profile="acct-1")
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.QUEUED
    assert run.host_wait_reason == "no host serves /srv/p for codex"
    assert run_id not in runs_with_a_task()  # the recovery schedule places it again
    assert runs_fail_unserved(grace=timedelta(seconds=900)) == []
    later = timezone.now() + timedelta(seconds=901)
    assert runs_fail_unserved(grace=timedelta(seconds=900), now=later) == [run_id]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error == (
        "no host could take the run for 900 s: no host serves /srv/p for codex"
    )
    assert_account_counts_match_rows()


def test_a_waiting_run_is_placed_once_a_host_serves_it() -> None:
    _host("a", ["/srv"], ["codewith"])
    _host("c", ["/other"], ["codex"])
    run_id = _route("/srv/p", 1, provider="codex")
    assert run_id not in _queues()
    _host("b", ["/srv"], ["codex"])
    enqueue_run(run_id)  # what the recovery schedule does with a run that has no task
    assert _queues()[run_id] == host_queue("b")
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.host_wait_reason is None and run.host_wait_since is None


def test_a_run_goes_only_to_a_host_that_has_its_project_and_waits_while_none_has() -> (
    None
):
    _host("a", ["/srv"], ["codewith"], projects={"/srv/p": True, "/srv/gone": False})
    _host("b", ["/srv"], ["codewith"], projects={"/srv/p": False, "/srv/gone": False})
    _host("c", ["/srv"], ["codewith"], projects={})  # has checked nothing yet
    runs = [_route("/srv/p", n) for n in range(6)]
    assert {_queues()[r] for r in runs} == {host_queue("a")}  # never b, nor unchecked c
    new = _route("/srv/new", 10)  # no host has checked it: it waits for them, no task
    gone = _route("/srv/gone", 11)  # c has not checked it either
    Host.objects.filter(name="c").update(projects={"/srv/gone": False})
    hosts_read_forget()
    enqueue_run(gone)
    waits = dict(
        WorkflowRun.objects.filter(id__in=[new, gone]).values_list(
            "id", "host_wait_reason"
        )
    )
    assert waits == {
        new: "waiting for the hosts to check /srv/new",
        gone: "no host has /srv/gone",
    }
    assert new not in _queues() and gone not in _queues()


def test_a_host_hands_a_run_back_once_and_all_declined_means_waiting(
    settings, tmp_path: Path
) -> None:
    settings.LOOPSWEB_HOST_NAME = "me"
    settings.LOOPSWEB_PROJECT_ROOTS = (str(tmp_path),)
    here, later = str(tmp_path / "here"), str(tmp_path / "later")
    os.mkdir(here)
    _host("me", [str(tmp_path)], ["codewith"], projects={})
    # A route names the project on this machine, a host: it checks its disk at once.
    first = _route(here, 1)
    assert _queues()[first] == host_queue("me")
    assert Host.objects.get(name="me").projects == {here: True}
    waiting = _route(later, 2)  # not on this disk: no other host, so it waits
    run = WorkflowRun.objects.get(pk=waiting)
    assert run.host_wait_reason == f"no host has {later}"
    os.mkdir(later)  # the clone arrives: the next heartbeat finds it and places the run
    assert host_projects_refresh() == [waiting]
    assert _queues()[waiting] == host_queue("me")
    # A delivery that misses (the clone went away): recorded, handed back, never looped.
    _host("b", [str(tmp_path)], ["codewith"], projects={later: True})
    os.rmdir(later)
    OrmQ.objects.all().delete()
    hand_back_elsewhere(waiting, later)
    assert _queues()[waiting] == host_queue("b")
    assert Host.objects.get(name="me").projects[later] is False
    settings.LOOPSWEB_HOST_NAME = (
        "b"  # b misses too: every host declined, the run waits
    )
    OrmQ.objects.all().delete()
    hand_back_elsewhere(waiting, later)
    run.refresh_from_db()
    assert run.hosts_declined == ["me", "b"] and waiting not in _queues()
    assert run.host_wait_reason == f"no host has {later}"
    later_now = timezone.now() + timedelta(seconds=901)
    assert runs_fail_unserved(grace=timedelta(seconds=900), now=later_now) == [waiting]


def test_a_run_waits_until_every_host_that_could_have_its_project_checked(
    settings, tmp_path: Path
) -> None:
    settings.LOOPSWEB_PROJECT_ROOTS = (str(tmp_path),)
    missing = str(tmp_path / "missing")
    _host("me", [str(tmp_path)], ["codewith"], projects={})
    _host("b", [str(tmp_path)], ["codewith"], projects={})
    settings.LOOPSWEB_HOST_NAME = "elsewhere"  # admitted on a machine that is no host
    run_id = _route(missing, 1)
    settings.LOOPSWEB_HOST_NAME = "me"
    assert host_projects_refresh() == []  # me lacks it; b has not checked yet
    assert Host.objects.get(name="me").projects == {missing: False}
    Host.objects.filter(name="b").update(projects={missing: False})
    hosts_read_forget()
    assert host_projects_refresh() == [run_id]  # every host checked: decided
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.host_wait_reason == f"no host has {missing}" and run_id not in _queues()


def test_the_plan_reads_no_table_and_writes_nothing_the_admission_records_the_project(
    settings, tmp_path: Path, django_assert_num_queries
) -> None:
    """The plan reads what its caller read (`plan_reads`) and writes nothing, from a drain,
    a delivery or ingestion's warning; the admission that follows lets this host record
    that it has the new project, so the run is placed on it at once."""
    settings.LOOPSWEB_PROJECT_ROOTS = (str(tmp_path),)
    settings.LOOPSWEB_HOST_NAME = "me"
    project = tmp_path / "new"
    project.mkdir()
    _host("me", [str(tmp_path)], ["codewith"], projects={})
    reads = plan_reads()
    with django_assert_num_queries(0):
        plan = plan_route(
            kind="generic",
            envelope=parse_envelope(generic_event(project, 1)),
            options=route_options({}),
            env={},
            reads=reads,
        )
    assert isinstance(plan, RoutePlan) and plan.project_path == str(project)
    assert never_routes(parse_envelope(generic_event(project, 2)), cwd="/") is None
    assert Host.objects.get(name="me").projects == {}  # nothing recorded by planning
    run_id = _route(str(project), 3)
    assert Host.objects.get(name="me").projects == {str(project): True}
    assert _queues()[run_id] == host_queue("me")


def test_admission_refuses_only_what_no_registered_host_serves() -> None:
    _host("a", ["/srv/a"], ["codewith"])
    _host("dead", ["/srv/d"], ["codewith"], age=3600)  # registered: still admitted
    assert _route("/srv/a/p", 1)
    assert _route("/srv/d/p", 2)
    with pytest.raises(ValidationError, match=r"no registered host serves /srv/x/p"):
        _route("/srv/x/p", 3)


def test_admission_refuses_a_provider_no_live_host_serves() -> None:
    # The route's runs would only wait ("no host serves ... for codex"): refused, naming
    # the provider and what the hosts have, nothing written.
    _host("a", ["/srv"], ["codewith", "claude"])
    _host("old", ["/srv"], ["codex"], age=3600)  # dead: a live host decides
    with pytest.raises(ValidationError) as refused:
        _route("/srv/p", 1, provider="codex")
    assert str(refused.value) == (
        "no live host serves provider codex (hosts: a [codewith, claude]); start a run "
        "cluster where its CLI is found (LOOPSWEB_CODEX_BIN), or route to a provider "
        "they have"
    )
    assert not WorkflowRun.objects.exists() and not OrmQ.objects.exists()
    Host.objects.filter(name="a").update(seen_at=timezone.now() - timedelta(hours=2))
    hosts_read_forget()
    # No host live at all (the clusters restart): a registered host that has it will do.
    assert _route("/srv/p", 2, provider="codex")
    with pytest.raises(ValidationError, match="no registered host serves provider"):
        _route("/srv/p", 3, provider="opencode")


def test_a_dead_hosts_queue_goes_to_the_live_hosts_at_once_fetched_rows_too() -> None:
    _host("a", ["/srv"], ["codewith"])
    runs = [_route("/srv/p", n) for n in range(2)]
    _host("b", ["/srv"], ["codewith"], age=0)
    for row in OrmQ.objects.all():  # both on a: one fetched (locked until Q_RETRY)
        row.key = host_queue("a")
        row.save()
    fetched = OrmQ.objects.filter(key=host_queue("a")).first()
    assert fetched is not None
    fetched.lock = timezone.now() + timedelta(seconds=5700)
    fetched.save()
    assert hosts_release_dead() == []  # a is live
    Host.objects.filter(name="a").update(seen_at=timezone.now() - timedelta(seconds=61))
    hosts_read_forget()
    assert sorted(hosts_release_dead()) == sorted(runs)
    assert {_queues()[r] for r in runs} == {host_queue("b")}
    assert Host.objects.get(name="a").released_at is not None
    assert hosts_release_dead() == []  # once


def test_a_parked_run_goes_back_only_to_the_host_of_its_worktree() -> None:
    _host("a", ["/srv"], ["codewith"])
    _host("b", ["/srv"], ["codewith"])
    run_id = _route("/srv/p", 1)
    WorkflowRun.objects.filter(pk=run_id).update(
        worktree_host="a", worktree_path="/x/" + run_id
    )
    assert {run_placement(run_id).host for _ in range(10)} == {"a"}
    assert run_placement(run_id, exclude={"a"}).wait_reason == (
        "its worktree is on host a, which is not live"
    )


def test_host_report_registers_roots_and_found_providers(settings) -> None:
    settings.LOOPSWEB_PROJECT_ROOTS = ("/srv",)
    host_report(workers=3, providers=["codewith"])
    host = Host.objects.get(name=settings.LOOPSWEB_HOST_NAME)
    assert host.roots == [os.path.realpath("/srv")] and host.workers == 3
    assert host.providers == ["codewith"] and host.queue.startswith("loopsweb-runs@")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LOOPSWEB_HOST_DEAD_SECONDS", "5", "must be"),
        ("LOOPSWEB_HOST_DEAD_SECONDS", "99999999", "at most 86400"),
        ("LOOPSWEB_NO_HOST_GRACE_SECONDS", "0", "must be"),
        ("LOOPSWEB_HOST_NAME", "a b", "LOOPSWEB_HOST_NAME must be"),
    ],
)
@pytest.mark.slow
def test_host_settings_are_bounded(name: str, value: str, message: str) -> None:
    env = {**os.environ, name: value, "DEBUG": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=scratch_cwd(),
        env={**env, "DJANGO_SETTINGS_MODULE": "loopsweb.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and message in done.stderr and name in done.stderr


def test_the_hosts_page_shows_each_host_and_the_runs_no_host_serves(
    admin_client, django_user_model
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from ledger.services.run_workers import run_worker_report

    _host("build-1", ["/srv/a"], ["codewith", "claude"])
    _host("build-2", ["/srv/b"], [], age=600)
    _host("build-3", ["/srv/c"], ["codex"])
    run_worker_report(cluster="loopsweb-runs", host="build-1", pid=11, cluster_pid=10)
    waiting = _route("/srv/a/p", 1, provider="codex")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse("ops:hosts"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "<code>build-1</code>" in html and "<code>/srv/a</code>" in html
    assert "<code>claude</code>" in html and "0 / 1" in html
    assert 'build-2</code> <span class="badge full">dead</span>' in html
    assert "none found" in html
    assert waiting in html and "no host serves /srv/a/p for codex" in html
    assert len(queries) <= 20
    anonymous = admin_client.__class__()
    assert anonymous.get(reverse("ops:hosts")).status_code == 302
    overview = admin_client.get(reverse("ops:overview")).content.decode()
    assert reverse("ops:hosts") in overview


def test_a_restarted_host_queues_again_what_its_killed_cluster_had_fetched(
    settings,
) -> None:
    from ledger.queue import host_queue_release_fetched

    me = settings.LOOPSWEB_HOST_NAME
    _host(me, ["/srv"], ["codewith"])
    fetched, delayed = _route("/srv/p", 1), _route("/srv/p", 2)
    rows = {run_id_of(r.payload): r for r in OrmQ.objects.filter(key=host_queue(me))}
    rows[fetched].lock = timezone.now() + timedelta(
        seconds=5700
    )  # fetched, never acked
    rows[fetched].save()
    rows[delayed].lock = timezone.now() + timedelta(seconds=5)  # a hand-back's delay
    rows[delayed].save()
    assert host_queue_release_fetched() == [fetched]
    queued = {
        run_id_of(r.payload): r.lock for r in OrmQ.objects.filter(key=host_queue(me))
    }
    assert set(queued) == {fetched, delayed}
    assert queued[fetched] <= timezone.now()  # deliverable now, not in 95 minutes
    assert host_queue_release_fetched() == []


def test_a_drain_admits_what_any_registered_host_serves_and_fails_the_rest_once() -> (
    None
):
    from routing.drains import drain_options, drain_run
    from routing.drains.inbox import inbox_ingest
    from routing.models import InboxEvent
    from tests.routing.helpers import todos_event

    _host("a", ["/srv/a"], ["codewith"])  # not this machine's roots: another machine's
    inbox_ingest(
        enumerate(
            [todos_event(project="/srv/a/p"), todos_event(project="/srv/x/p")], start=1
        )
    )
    report = drain_run(
        options=drain_options("todos-task", {"max_dispatch": 10}), env={}
    )
    assert report.counts["created"] == 1, report.counts
    states = dict(InboxEvent.objects.values_list("state", "last_reason"))
    assert set(states) == {"admitted", "failed"}, states
    assert "no registered host serves /srv/x/p" in (states["failed"] or "")
    again = drain_run(options=drain_options("todos-task", {"max_dispatch": 10}), env={})
    assert again.counts["considered"] == 0  # failed once, never tried again


def test_the_hosts_command_lists_and_forgets_only_a_dead_host() -> None:
    import io
    import json as json_module

    from django.core.management import call_command
    from django.core.management.base import CommandError

    _host("live-1", ["/srv/a"], ["codewith"])
    _host("old-1", ["/srv/o"], ["codewith"], age=3600)
    out = io.StringIO()
    call_command("hosts", "--json", stdout=out)
    listed = {h["name"]: h["live"] for h in json_module.loads(out.getvalue())["hosts"]}
    assert listed == {"live-1": True, "old-1": False}
    with pytest.raises(CommandError, match="is live"):
        call_command("hosts", "--forget", "live-1", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no host named"):
        call_command("hosts", "--forget", "nope", stdout=io.StringIO())
    call_command("hosts", "--forget", "old-1", stdout=io.StringIO())
    assert list(Host.objects.values_list("name", flat=True)) == ["live-1"]
    with pytest.raises(ValidationError, match="no registered host serves"):
        _route("/srv/o/p", 1)  # its roots no longer admit
