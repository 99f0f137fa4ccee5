"""Upstream parity, second pass (issue 29 items 1, 3, 4, 6, 12), as scenarios through
`route_event`, `drain` and `schedule_drain` with upstream's exact strings and fields
(docs/upstream.md §3.2, §3.8, §5.3, §5.4)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings

from ledger.models import Account, WorkflowWorkItem
from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import InboxEvent
from tests.routing.api.helpers import row_counts
from tests.routing.helpers import (
    drain_rows,
    plain_project,
    todos_event,
    wipe_drain_rows,
)

pytestmark = pytest.mark.django_db

REQUIRED_NOT_GIT = (
    "worktreeMode=required but projectPath is not an existing git repository: {path}"
)


def _route(event: dict[str, Any], *args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command(
        "route_event",
        "todos-task",
        "--event-json",
        json.dumps(event),
        *args,
        "--json",
        stdout=out,
    )
    return json.loads(out.getvalue())


def _drain(kind: str, *args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("drain", kind, *args, "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.fixture
def plain(tmp_path: Path, settings: Any) -> Path:
    return plain_project(tmp_path, settings)


# --- item 1: the early dedupe comes before the worktree check ----------------------------------


def test_a_replayed_routed_task_with_worktree_required_on_a_plain_path_is_deduped(
    plain: Path,
) -> None:
    event = todos_event("T-1", project=str(plain))
    created = _route(event)
    assert created["kind"] == "created" and created["deduped"] is False
    before = row_counts()
    replay = _route(event, "--worktree-mode", "required")  # exit 0: no CommandError
    assert replay["kind"] == "deduped"
    assert replay["deduped"] is True and replay["dedupedBy"] == "work-item"
    assert replay["loop"]["id"] == created["loop"]["id"]
    assert replay["workItem"]["id"] == created["workItem"]["id"]
    assert row_counts() == before  # the early dedupe writes nothing


def test_a_new_task_with_worktree_required_on_a_plain_path_is_refused(
    plain: Path,
) -> None:
    before = row_counts()
    with pytest.raises(CommandError) as refused:
        _route(todos_event("T-2", project=str(plain)), "--worktree-mode", "required")
    assert str(refused.value) == REQUIRED_NOT_GIT.format(path=plain)
    assert row_counts() == before


def test_a_generic_route_is_refused_even_when_it_ran_before(plain: Path) -> None:
    """No early dedupe for the generic kind (docs/upstream.md §3.2, the generic table)."""
    event = {
        "id": "g-1",
        "type": "build.failed",
        "source": "ci",
        "data": {"project_path": str(plain), "message": "fix"},
    }
    call_command(
        "route_event",
        "generic",
        "--event-json",
        json.dumps(event),
        stdout=io.StringIO(),
    )
    with pytest.raises(CommandError, match="worktreeMode=required"):
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps(event),
            "--worktree-mode",
            "required",
            stdout=io.StringIO(),
        )


@pytest.mark.parametrize("batch_size", [1, 25])
def test_a_drain_with_worktree_required_dedupes_routed_tasks_and_skips_new_ones(
    plain: Path, settings: Any, batch_size: int
) -> None:
    """One at a time and batched: the routed task is deduped (the same loop), the new one
    is a route error (skipped, `routeError: true`), the drain exits 0."""
    settings.LOOPSWEB_DRAIN_BATCH_SIZE = batch_size
    routed = todos_event("T-3", project=str(plain))
    first = _route(routed)
    fresh = todos_event("T-4", project=str(plain))
    inbox_ingest(enumerate([routed, fresh], start=1))
    report = _drain("todos-task", "--worktree-mode", "required", "--max-dispatch", "5")
    by_task = {r["taskId"]: r for r in report["results"]}
    assert by_task["T-3"]["kind"] == "deduped"
    assert by_task["T-3"]["dedupedBy"] == "work-item"
    assert by_task["T-3"]["loop"]["id"] == first["loop"]["id"]
    assert by_task["T-4"]["kind"] == "skipped" and by_task["T-4"]["routeError"] is True
    assert by_task["T-4"]["skipped"] is True
    assert by_task["T-4"]["reason"] == REQUIRED_NOT_GIT.format(path=plain)
    assert report["fatal"] == 0 and report["deduped"] == 1 and report["skipped"] == 1
    assert WorkflowWorkItem.objects.count() == 1
    states = dict(InboxEvent.objects.values_list("event_id", "state"))
    assert states == {"evt-T-3": "admitted", "evt-T-4": "skipped"}


def test_a_routed_task_in_a_full_scope_is_deduped_not_held(plain: Path) -> None:
    """The refusal comes before the caps: a plan with one is deduped or refused, never held
    (docs/upstream.md §3.2.10 before docs/upstream.md §3.6)."""
    routed = todos_event("T-5", project=str(plain))
    _route(routed)
    inbox_ingest(enumerate([routed], start=1))
    report = _drain(
        "todos-task", "--worktree-mode", "required", "--max-active-per-project", "1"
    )
    assert [r["kind"] for r in report["results"]] == ["deduped"]


# --- item 3: the evidence file is the full report ----------------------------------------------


def test_the_evidence_file_carries_each_results_task_and_workflow_body(
    tmp_path: Path,
) -> None:
    inbox_ingest(
        enumerate(
            [
                todos_event("E-1", description="Add a README."),
                todos_event("E-2", tags=["auto:route", "manual"]),
            ],
            start=1,
        )
    )
    evidence = tmp_path / "evidence"
    report = _drain(
        "todos-task", "--evidence-dir", str(evidence), "--max-dispatch", "5"
    )
    [path] = list(evidence.iterdir())
    assert path.stat().st_mode & 0o777 == 0o600
    full = json.loads(path.read_text())
    assert full["evidencePath"] == str(path) == report["evidencePath"]
    by_task = {r["taskId"]: r for r in full["results"]}
    created = by_task["E-1"]
    assert created["task"] == {
        "id": "E-1",
        "title": "Fix E-1",
        "description": "Add a README.",
        "tags": ["auto:route"],
        "projectPath": "/srv/app",
    }
    steps = created["workflow"]["steps"]
    assert [s["id"] for s in steps] == ["worker", "verifier"]
    assert "Add a README." in json.dumps(steps)
    assert created["invocation"]["subjectRef"]["raw"]["description"] == "Add a README."
    assert created["loop"]["target"]["input"] == {
        "workflowInvocationId": created["invocation"]["id"],
        "workflowWorkItemId": created["workItem"]["id"],
    }
    skipped = by_task["E-2"]
    assert skipped["kind"] == "skipped" and skipped["skipped"] is True
    assert skipped["task"]["tags"] == ["auto:route", "manual"]
    assert skipped["reason"] == "task has disallowed tag: manual"


def test_a_held_result_in_the_evidence_carries_the_rendered_body_not_stored() -> None:
    inbox_ingest(
        enumerate([todos_event("H-1"), todos_event("H-2"), todos_event("H-3")], start=1)
    )
    report = _drain(
        "todos-task", "--max-active-per-project", "1", "--max-dispatch", "5"
    )
    held = [r for r in report["results"] if r["kind"] == "throttled"]
    assert held and all(r["workflow"]["stored"] is False for r in held)
    assert all(r["task"]["id"] in ("H-2", "H-3") for r in held)
    assert held[0]["reason"] == "project active workflow limit reached (1/1)"


# --- item 4: a Repository: line names the project ----------------------------------------------


def test_a_repository_line_gives_the_project_path_and_the_prefix_filters_on_it(
    tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_PROJECT_ROOTS = [str(tmp_path)]
    # Both projects are work trees (a `.git` each), so a path and the prefix normalize to
    # themselves (their git top level) whatever lies above the test's directory.
    (tmp_path / "hasna" / "loops" / ".git").mkdir(parents=True)
    (tmp_path / "other" / ".git").mkdir(parents=True)
    by_path = todos_event("R-1", description=f"Do it.\nRepository: {tmp_path}/other")
    by_name = todos_event("R-2", description="Do it.\n\nRepository: hasna/loops\n")
    for event in (by_path, by_name):
        del event["data"]["project_path"]
    inbox_ingest(enumerate([by_path, by_name], start=1))
    report = _drain(
        "todos-task",
        "--project-path-prefix",
        str(tmp_path / "hasna" / "loops"),
        "--max-dispatch",
        "5",
    )
    assert report["filteredCandidates"] == report["candidates"] == 1
    [result] = report["results"]
    assert result["taskId"] == "R-2" and result["kind"] == "created"
    assert result["workItem"]["projectKey"] == str(tmp_path / "hasna" / "loops")
    created = _route(by_path)
    assert created["workItem"]["projectKey"] == str(tmp_path / "other")


# --- item 6: result fields as upstream writes them ---------------------------------------------


def test_created_results_carry_the_whole_invocation_and_the_loop_target() -> None:
    created = _route(todos_event("F-1"))
    assert created["deduped"] is False and "dedupedBy" not in created
    invocation = created["invocation"]
    assert invocation["templateId"] == "todos-task-worker-verifier"
    assert invocation["sourceRef"]["dedupeKey"] == "todos-task:F-1"
    assert invocation["subjectRef"]["kind"] == "task"
    assert invocation["intent"] == "route"
    assert invocation["outputPolicy"] == {
        "report": "always",
        "createTask": "on_failure",
    }
    assert invocation["scope"]["projectPath"] == "/srv/app"
    assert created["loop"]["target"]["type"] == "workflow"
    assert (
        created["loop"]["target"]["input"]["workflowWorkItemId"]
        == (created["workItem"]["id"])
    )
    assert created["sandboxPreflight"] == [
        {"stepId": "worker", "method": "provider-native-sandbox"},
        {"stepId": "verifier", "method": "provider-native-sandbox"},
    ]
    again = _route(todos_event("F-1"))
    assert again["kind"] == "deduped" and again["deduped"] is True
    assert again["dedupedBy"] == "work-item"


def test_an_eligibility_skip_is_skipped_true() -> None:
    skipped = _route(todos_event("F-2", tags=[]))
    assert skipped["kind"] == "skipped" and skipped["skipped"] is True
    assert skipped["reason"] == "missing explicit route opt-in"


def test_routes_show_answers_item() -> None:
    created = _route(todos_event("F-3"))
    out = io.StringIO()
    call_command("routes", "show", created["workItem"]["id"], "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["item"]["id"] == created["workItem"]["id"]
    assert shown["item"] == shown["workItem"]


def test_a_drain_report_has_filtered_candidates_and_a_schedule_replays_it(
    settings: Any,
) -> None:
    inbox_ingest(enumerate([todos_event("F-4", tags=["auto:route", "x"])], start=1))
    report = _drain("todos-task", "--tags", "x")
    assert report["filteredCandidates"] == 1 and report["created"] == 1
    call_command(
        "schedule_drain", "nightly", "todos-task", "--every", "5m", stdout=io.StringIO()
    )
    from django_q.models import Schedule

    kwargs = Schedule.objects.get(name="nightly").kwargs
    scheduled = drain_run(options=drain_options("todos-task", {}, name="nightly"))
    assert (
        "nightly" in kwargs
        and scheduled.to_dict(compact=False)["filteredCandidates"] == 0
    )


# --- item 12: the per-account cap in force ------------------------------------------------------


def test_a_registered_pool_of_another_provider_shows_its_default_cap(
    admin_client: Client,
) -> None:
    for name in ("cx-a", "cx-b"):
        Account.objects.create(name=name, provider="codex")
    inbox_ingest(enumerate([todos_event("C-1")], start=1))
    report = _drain(
        "todos-task", "--provider", "codex", "--auth-profile-pool", "cx-a,cx-b"
    )
    assert report["created"] == 1 and report["results"][0]["accountProfiles"]
    accounts = admin_client.get("/api/v1/accounts").json()["accounts"]
    assert {a["profile"]: a["maxPerProfile"] for a in accounts} == {
        "cx-a": 2,
        "cx-b": 2,
    }
    page = admin_client.get("/ops/accounts/").content.decode()
    assert "no cap" not in page


@override_settings(LOOPSWEB_DRAIN_BATCH_SIZE=1)
def test_an_explicit_zero_still_shows_no_cap(admin_client: Client) -> None:
    for name in ("cx-c", "cx-d"):
        Account.objects.create(name=name, provider="codex")
    inbox_ingest(enumerate([todos_event("C-2")], start=1))
    _drain(
        "todos-task",
        "--provider",
        "codex",
        "--auth-profile-pool",
        "cx-c,cx-d",
        "--max-per-profile",
        "0",
    )
    accounts = admin_client.get("/api/v1/accounts").json()["accounts"]
    assert {a["maxPerProfile"] for a in accounts} == {None}


@pytest.mark.slow
def test_batched_and_one_at_a_time_drains_agree_on_refusals(
    plain: Path, tmp_path: Path, settings: Any
) -> None:
    """Routed, new and ordinary tasks mixed, under a project cap: both drain paths give the
    same results and leave the same rows (as tests/routing/drains/test_batch.py checks for
    the generic kind)."""
    from tests.ledger.runner_helpers import git_project

    repo = git_project(tmp_path / "repo")

    def scenario(batch_size: int) -> tuple[Any, Any]:
        settings.LOOPSWEB_DRAIN_BATCH_SIZE = batch_size
        routed = [todos_event(f"Q-{n}", project=str(plain)) for n in range(2)]
        for event in routed:
            _route(event)
        fresh = [todos_event(f"N-{n}", project=str(plain)) for n in range(2)]
        git = [todos_event(f"G-{n}", project=str(repo)) for n in range(3)]
        mixed = [routed[0], fresh[0], git[0], routed[1], git[1], fresh[1], git[2]]
        inbox_ingest(enumerate(mixed, start=1))
        report = _drain(
            "todos-task",
            "--worktree-mode",
            "required",
            "--max-active-per-project",
            "2",
            "--max-dispatch",
            "10",
        )
        outcomes = [
            (r["taskId"], r["kind"], r.get("reason"), bool(r.get("routeError")))
            for r in report["results"]
        ]
        return outcomes, drain_rows()

    one = scenario(1)
    wipe_drain_rows()
    batched = scenario(25)
    assert one == batched
    kinds = [kind for _, kind, _, _ in one[0]]
    assert kinds.count("deduped") == 2 and kinds.count("skipped") == 2
    assert kinds.count("created") == 2 and kinds.count("throttled") == 1
