"""Isolation at admission (issue 16): project roots, worktree mode, sandbox preflight.

Every entry point refuses the same routes before anything is written: the API (400, no
row), a drain (the inbox row is failed with the reason), `route_event` (non-zero exit).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from domain.errors import ValidationError
from ledger.models import WorkflowInvocation, WorkflowRun, WorkflowWorkItem
from routing.admission.options import DANGER_NEEDS_BREAK_GLASS
from routing.api.forms import api_words
from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from runs.projects import PATH_EMPTY, ROOTS_UNSET
from tests.ledger.runner_helpers import child_database_url, git_project
from tests.processes import manage
from tests.routing.api.helpers import make_token, post_events, row_counts
from tests.routing.helpers import generic_event, todos_event

pytestmark = pytest.mark.django_db

OUTSIDE = "outside LOOPSWEB_PROJECT_ROOTS"
NO_ISOLATION = (
    "route step worker has no verified unattended isolation; use provider sandbox "
    "workspace-write/read-only/enabled, worktreeMode=required, or explicit manual break-glass"
)


def _symlink_out(tmp_path: Path) -> str:
    link = tmp_path / "escape"
    link.symlink_to("/etc")
    return str(link)


# (name, project path from tmp_path, the error the route gets)
BAD_PATHS: list[tuple[str, Callable[[Path], str], str]] = [
    ("etc", lambda _: "/etc", f"project path /etc resolves to /etc, {OUTSIDE}"),
    ("root", lambda _: "/", f"project path / resolves to /, {OUTSIDE}"),
    ("home", lambda _: "~", "project path must be an absolute path: '~'"),
    ("symlink", _symlink_out, f"resolves to /etc, {OUTSIDE}"),
    (
        "dotdot",
        lambda p: f"{p}/proj/../../../../../etc",
        "project path must not contain '..' segments",
    ),
    ("empty", lambda _: "", PATH_EMPTY),
]


@pytest.fixture(params=BAD_PATHS, ids=[case[0] for case in BAD_PATHS])
def bad_path(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    _name, make, error = request.param
    return make(tmp_path), error


def _envelope(project: str, **data: Any) -> dict[str, Any]:
    event = generic_event(**data)
    event["data"]["project_path"] = project
    return event


def _nothing_routed() -> None:
    assert not WorkflowWorkItem.objects.exists()
    assert not WorkflowInvocation.objects.exists()
    assert not WorkflowRun.objects.exists()


def _route_now(client: Client, event: dict[str, Any], query: str = "") -> Any:
    token = make_token("ingest")[1]
    return post_events(client, token, event, query="route=now" + query)


def test_the_api_refuses_a_project_path_outside_the_roots_and_stores_nothing(
    client: Client, bad_path: tuple[str, str]
) -> None:
    path, error = bad_path
    token = make_token("ingest")[1]
    before = row_counts()
    response = post_events(client, token, _envelope(path), query="route=now")
    assert response.status_code == 400
    assert error in response.json()["error"]
    assert row_counts() == before
    assert not InboxEvent.objects.exists()


def test_a_drain_fails_the_inbox_row_with_the_reason(bad_path: tuple[str, str]) -> None:
    path, error = bad_path
    inbox_ingest(enumerate([_envelope(path)], start=1))
    report = drain_run(options=drain_options("generic", {}), env={})
    assert report.counts["fatal"] == 1 and report.counts["created"] == 0
    row = InboxEvent.objects.get()
    assert row.state == "failed"
    assert error in row.last_reason
    _nothing_routed()


def test_route_event_refuses_with_the_reason(bad_path: tuple[str, str]) -> None:
    path, error = bad_path
    with pytest.raises(CommandError) as refused:
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps(_envelope(path)),
            stdout=io.StringIO(),
        )
    assert error in str(refused.value)
    _nothing_routed()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_route_event_as_a_process_exits_non_zero_and_writes_nothing(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "DATABASE_URL": child_database_url(), "LOOPSWEB_TESTING": "1"}
    outside = manage(
        env, "route_event", "generic", input=json.dumps(_envelope("/etc")), check=False
    )
    assert outside.returncode != 0
    assert f"project path /etc resolves to /etc, {OUTSIDE}" in outside.stderr
    _nothing_routed()
    # The same command with a project inside a root is admitted.
    (tmp_path / "proj").mkdir()
    inside = manage(
        env,
        "route_event",
        "generic",
        "--json",
        input=json.dumps(_envelope(str(tmp_path / "proj"))),
        check=False,
    )
    assert inside.returncode == 0, inside.stderr
    assert json.loads(inside.stdout)["kind"] == "created"
    assert WorkflowWorkItem.objects.get().project_key == str(tmp_path / "proj")


def test_a_path_inside_a_root_is_admitted_by_all_three(
    client: Client, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    response = _route_now(client, _envelope(str(project)))
    assert response.status_code == 202
    assert response.json()["results"][0]["kind"] == "created"

    inbox_ingest(enumerate([_envelope(str(project))], start=1))
    assert (
        drain_run(options=drain_options("generic", {}), env={}).counts["created"] == 1
    )

    out = io.StringIO()
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(_envelope(str(project))),
        "--json",
        stdout=out,
    )
    assert json.loads(out.getvalue())["kind"] == "created"
    assert set(WorkflowWorkItem.objects.values_list("project_key", flat=True)) == {
        str(project)
    }


def test_a_symlink_inside_a_root_resolves_to_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "alias").symlink_to(target)
    out = io.StringIO()
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(_envelope(str(tmp_path / "alias"))),
        "--json",
        stdout=out,
    )
    assert WorkflowWorkItem.objects.get().project_key == str(target)


@pytest.mark.slow
def test_a_subdirectory_of_a_git_project_routes_to_its_top_level(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "repo")
    (project / "src").mkdir()
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(_envelope(str(project / "src"))),
        stdout=io.StringIO(),
    )
    assert WorkflowWorkItem.objects.get().project_key == str(project)


@pytest.mark.slow
def test_the_git_top_level_is_never_looked_for_above_the_root(
    tmp_path: Path, settings: Any
) -> None:
    repo = git_project(tmp_path / "repo")
    inner = repo / "inner"
    inner.mkdir()
    settings.LOOPSWEB_PROJECT_ROOTS = (str(inner),)
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(_envelope(str(inner))),
        stdout=io.StringIO(),
    )
    assert WorkflowWorkItem.objects.get().project_key == str(inner)


def test_no_roots_refuses_every_route_naming_the_setting(
    client: Client, settings: Any, tmp_path: Path
) -> None:
    settings.LOOPSWEB_PROJECT_ROOTS = ()
    response = _route_now(client, _envelope(str(tmp_path)))
    assert response.status_code == 400
    assert ROOTS_UNSET in response.json()["error"]
    assert "LOOPSWEB_PROJECT_ROOTS" in ROOTS_UNSET
    with pytest.raises(CommandError, match="set LOOPSWEB_PROJECT_ROOTS"):
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps(_envelope(str(tmp_path))),
            stdout=io.StringIO(),
        )
    _nothing_routed()


def test_ops_pages_say_which_setting_to_set_when_no_root_is_configured(
    admin_client: Client, settings: Any
) -> None:
    assert "project-roots-unset" not in admin_client.get("/ops/").content.decode()
    settings.LOOPSWEB_PROJECT_ROOTS = ()
    for url in ("/ops/", "/ops/deferrals/", "/ops/accounts/", "/ops/drains/"):
        page = admin_client.get(url).content.decode()
        assert 'id="project-roots-unset"' in page, url
        assert "LOOPSWEB_PROJECT_ROOTS" in page


def test_the_route_no_longer_falls_back_to_the_process_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Even when the routing process sits inside a root, an event naming no path is refused.
    monkeypatch.chdir(tmp_path)
    event = generic_event()
    del event["data"]["project_path"]
    with pytest.raises(CommandError, match="no project path"):
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps(event),
            stdout=io.StringIO(),
        )
    _nothing_routed()


# --- worktree mode and sandbox preflight -----------------------------------------------------


def test_worktree_mode_required_on_a_non_git_directory_is_refused_with_upstreams_message(
    client: Client, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    message = (
        "worktreeMode=required but projectPath is not an existing git repository: "
        f"{plain}"
    )
    token = make_token("ingest")[1]
    before = row_counts()
    response = post_events(
        client, token, _envelope(str(plain)), query="route=now&worktree_mode=required"
    )
    assert response.status_code == 400 and message in response.json()["error"]
    assert row_counts() == before
    with pytest.raises(CommandError) as refused:
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps(_envelope(str(plain))),
            "--worktree-mode",
            "required",
            stdout=io.StringIO(),
        )
    assert str(refused.value) == message
    inbox_ingest(enumerate([todos_event(project=str(plain))], start=1))
    report = drain_run(
        options=drain_options("todos-task", {"worktree_mode": "required"}), env={}
    )
    # A route error in a drain: skipped, not fatal (docs/upstream.md §5.2.3).
    assert report.counts["fatal"] == 0 and report.counts["skipped"] == 1
    assert report.results[0]["routeError"] is True
    assert message in InboxEvent.objects.get().last_reason
    _nothing_routed()


@pytest.mark.slow
def test_worktree_mode_required_on_a_git_project_is_admitted_and_recorded(
    tmp_path: Path,
) -> None:
    project = git_project(tmp_path / "repo")
    out = io.StringIO()
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(_envelope(str(project))),
        "--worktree-mode",
        "required",
        "--provider",
        "claude",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    assert result["kind"] == "created"
    # claude has no sandbox of its own: the worktree is what isolates it.
    assert result["sandboxPreflight"] == [
        {"stepId": "worker", "method": "isolated-worktree"},
        {"stepId": "verifier", "method": "isolated-worktree"},
    ]
    item = WorkflowWorkItem.objects.select_related("invocation").get()
    assert item.invocation.scope_json["worktreePolicy"] == "required"
    steps = WorkflowRun.objects.get().workflow.steps_json
    assert {s["target"]["worktreeMode"] for s in steps} == {"required"}


def test_danger_full_access_without_the_marker_is_refused_everywhere(
    client: Client, tmp_path: Path
) -> None:
    response = _route_now(
        client, _envelope(str(tmp_path)), "&sandbox=danger-full-access"
    )
    assert response.status_code == 400
    assert response.json()["error"] == api_words(DANGER_NEEDS_BREAK_GLASS)
    # An ingest token cannot break the glass: the option is not an API parameter.
    response = _route_now(
        client,
        _envelope(str(tmp_path)),
        "&sandbox=danger-full-access&manual_break_glass=1",
    )
    assert response.status_code == 400
    assert "unknown query parameter: manual_break_glass" in response.json()["error"]
    with pytest.raises(CommandError) as refused:
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps(_envelope(str(tmp_path))),
            "--sandbox",
            "danger-full-access",
            stdout=io.StringIO(),
        )
    assert str(refused.value) == DANGER_NEEDS_BREAK_GLASS
    # A drain refuses the option before it reads an event: none is marked failed.
    inbox_ingest(enumerate([_envelope(str(tmp_path))], start=1))
    with pytest.raises(ValidationError, match=re.escape(DANGER_NEEDS_BREAK_GLASS)):
        drain_options("generic", {"sandbox": "danger-full-access"})
    assert InboxEvent.objects.get().state == "pending"
    _nothing_routed()


def test_danger_full_access_with_manual_break_glass_passes_and_is_recorded(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(_envelope(str(tmp_path))),
        "--sandbox",
        "danger-full-access",
        "--manual-break-glass",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    assert result["sandboxPreflight"][0] == {
        "stepId": "worker",
        "method": "manual-break-glass",
    }
    invocation = WorkflowInvocation.objects.get()
    assert invocation.scope_json["manualBreakGlass"] is True
    assert invocation.scope_json["sandbox"] == "danger-full-access"
    target = WorkflowRun.objects.get().workflow.steps_json[0]["target"]
    assert target["sandbox"] == "danger-full-access"
    assert target["allowlist"] == {
        "enforcement": "metadata_only",
        "commands": ["manual-break-glass"],
    }


@pytest.mark.slow
def test_a_provider_with_no_sandbox_and_worktrees_off_is_refused(
    client: Client, tmp_path: Path
) -> None:
    project = git_project(tmp_path / "repo")
    for path in (project, tmp_path):  # off: even a git project gets no worktree
        response = _route_now(
            client, _envelope(str(path)), "&provider=claude&worktree_mode=off"
        )
        assert response.status_code == 400
        assert NO_ISOLATION in response.json()["error"]
    # auto on a directory that is not a git work tree: the same, no worktree to rely on.
    with pytest.raises(CommandError) as refused:
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps(_envelope(str(tmp_path))),
            "--provider",
            "claude",
            stdout=io.StringIO(),
        )
    assert str(refused.value) == NO_ISOLATION
    _nothing_routed()


def test_codewith_in_its_workspace_write_sandbox_passes_without_a_worktree(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(_envelope(str(tmp_path))),
        "--worktree-mode",
        "off",
        "--sandbox",
        "read-only",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    assert {s["method"] for s in result["sandboxPreflight"]} == {
        "provider-native-sandbox"
    }
    target = WorkflowRun.objects.get().workflow.steps_json[0]["target"]
    assert (target["sandbox"], target["worktreeMode"]) == ("read-only", "off")


def test_bad_option_values_are_refused_with_the_option_named(client: Client) -> None:
    for query, message in (
        # The API names the parameter it was sent (issue 29 item 13).
        ("&worktree_mode=main", "worktree_mode must be off, auto or required"),
        (
            "&sandbox=none",
            "sandbox must be read-only, workspace-write or danger-full-access",
        ),
    ):
        response = _route_now(client, generic_event(), query)
        assert response.status_code == 400 and message in response.json()["error"]
    with pytest.raises(CommandError, match="--worktree-mode must be"):
        call_command(
            "drain", "generic", "--worktree-mode", "sometimes", stdout=io.StringIO()
        )


def test_schedule_drain_keeps_the_isolation_options(tmp_path: Path) -> None:
    from django_q.models import Schedule

    call_command(
        "schedule_drain",
        "isolated",
        "generic",
        "--every",
        "5m",
        "--worktree-mode",
        "required",
        "--sandbox",
        "read-only",
        stdout=io.StringIO(),
    )
    kwargs = Schedule.objects.get(name="isolated").kwargs
    assert (
        "'worktree_mode': 'required'" in kwargs and "'sandbox': 'read-only'" in kwargs
    )
    with pytest.raises(CommandError, match="--sandbox must be"):
        call_command(
            "schedule_drain",
            "bad",
            "generic",
            "--every",
            "5m",
            "--sandbox",
            "everything",
            stdout=io.StringIO(),
        )
