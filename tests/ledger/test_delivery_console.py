"""The run's work on the console and in the API, Discard and the prune of run branches
(issue 40 items 3 and 4): real git, a bare `origin`, the GitHub stand-in, the fake agent in
this process, the pages through Django's test client as a staff user."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from ledger.models import RunStatus, WorkflowRun
from runs import delivery_view
from runs.delivery import (
    NO_CHANGES,
    NOT_DELIVERED_FAILED,
    delivery_outcome,
    redeliverable,
)
from runs.discard import run_branches_prune
from runs.worktrees import worktree_branch
from tests.forge_standin import Forge
from tests.ledger.delivery_helpers import (
    TOKEN,
    project_with_origin,
    remote_branches,
    run_task,
)
from tests.ledger.runner_helpers import FakeAgent, git

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _branches(project: Path) -> list[str]:
    return sorted(git(project, "branch", "--list", "--format=%(refname:short)").split())


def test_the_item_page_and_the_api_show_the_runs_work_escaped_and_capped(
    agent: FakeAgent,
    forge: Forge,
    tmp_path: Path,
    admin_client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project, _ = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "<b>note.txt"}})
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert run.status == RunStatus.SUCCEEDED
    page = admin_client.get(reverse("ops:work-item", args=[run.work_item_id]))
    html = page.content.decode()
    assert page.status_code == 200
    # The PR link and state, the commit with its step and account, the escaped patch.
    assert 'href="https://github.example/acme/widgets/pull/1"' in html
    assert "pull request #1" in html and "(open)" in html
    worker = run.step_runs.get(step_id="worker")
    assert f"<code>{worker.commit_sha[:12]}</code> step worker" in html
    assert "&lt;b&gt;note.txt" in html and "<b>note.txt" not in html
    assert f"+{run.id}" in html  # the line the agent wrote, in the patch
    assert "show all" not in html
    assert TOKEN not in html

    monkeypatch.setattr(delivery_view, "PATCH_CHARS", 40)
    html = admin_client.get(
        reverse("ops:work-item", args=[run.work_item_id])
    ).content.decode()
    assert "show all" in html
    full = admin_client.get(reverse("ops:run-patch", args=[run.id]))
    assert full["Content-Type"].startswith("text/plain")
    assert full["X-Content-Type-Options"] == "nosniff"
    assert (
        "<b>note.txt" in full.content.decode() and f"+{run.id}" in full.content.decode()
    )

    api = admin_client.get(f"/api/v1/work-items/{run.work_item_id}").json()
    [shown] = api["runs"]
    assert shown["branch"] == worktree_branch(run.id)
    assert shown["pullRequest"]["number"] == 1
    assert shown["pullRequest"]["url"] == "https://github.example/acme/widgets/pull/1"
    assert shown["delivery"]["state"] == "delivered"
    assert [c["stepId"] for c in shown["commits"]] == ["worker"]
    assert shown["commits"][0]["sha"] == worker.commit_sha
    assert "note.txt" in shown["diffstat"]
    assert TOKEN not in json.dumps(api)


def test_routes_show_names_the_delivery_option_and_what_was_delivered(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, _ = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    run = run_task(
        project, deliver="pull-request", github_repo="acme/widgets", deliver_failed=True
    )
    out = io.StringIO()
    call_command("routes", "show", run.work_item_id, stdout=out)
    text = out.getvalue()
    assert (
        "deliver pull-request (remote origin, failed runs too, GitHub acme/widgets)"
        in text
    )
    assert (
        "delivery: pull request #1 open: https://github.example/acme/widgets/pull/1"
        in text
    )
    out = io.StringIO()
    call_command("routes", "show", run.work_item_id, "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["deliver"]["deliver"] == "pull-request"
    assert shown["runs"][0]["pullRequest"]["number"] == 1


def test_deliver_again_from_the_item_page_opens_the_pr_a_refusal_failed_to(
    agent: FakeAgent, forge: Forge, tmp_path: Path, admin_client: Client
) -> None:
    project, _ = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    forge.fail_next(401, {"message": "Bad credentials"})
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    page = admin_client.get(
        reverse("ops:work-item", args=[run.work_item_id])
    ).content.decode()
    assert "delivery failed: GitHub answered 401: Bad credentials" in page
    assert ">Deliver again</button>" in page
    done = admin_client.post(reverse("ops:run-action", args=[run.id, "deliver"]))
    assert done.status_code == 302
    run.refresh_from_db()
    assert (
        run.delivery_json["state"] == "delivered" and run.status == RunStatus.SUCCEEDED
    )
    assert _messages(done) == [("success", f"Run {run.id}: delivered.")]
    page = admin_client.get(
        reverse("ops:work-item", args=[run.work_item_id])
    ).content.decode()
    assert ">Deliver again</button>" not in page and "pull request #1" in page


def _messages(response: Any) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def test_deliver_again_is_offered_only_for_work_its_route_delivers(
    agent: FakeAgent, forge: Forge, tmp_path: Path, admin_client: Client
) -> None:
    """Issue 62 item 2: a failed run of a route without --deliver-failed showed the button,
    and pressing it said "delivered" in green while nothing reached the forge."""
    project, origin = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}, "verifier": {"exit": 2}})
    failed = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert failed.status == RunStatus.FAILED
    assert failed.delivery_json["reason"] == NOT_DELIVERED_FAILED
    item_page = reverse("ops:work-item", args=[failed.work_item_id])
    page = admin_client.get(item_page).content.decode()
    assert f"not delivered ({NOT_DELIVERED_FAILED})" in page
    assert ">Deliver again</button>" not in page and not redeliverable(failed)
    # Posted all the same (a page from before): refused in red, nothing sent anywhere.
    done = admin_client.post(reverse("ops:run-action", args=[failed.id, "deliver"]))
    assert _messages(done) == [("error", "deliver refused: nothing to deliver again")]
    assert forge.requests == [] and remote_branches(origin) == {
        "main": git(project, "rev-parse", "main").strip()
    }
    with pytest.raises(CommandError, match="nothing to deliver again"):
        call_command("deliver_run", failed.id)
    # With --deliver-failed but no change at all: nothing to deliver either.
    agent.configure(steps={"verifier": {"exit": 2}})
    empty = run_task(project, deliver="push", deliver_failed=True)
    assert empty.delivery_json["reason"] == NO_CHANGES and not redeliverable(empty)
    # A record that says anything but delivered never reads as delivered.
    assert delivery_outcome("r1", failed.delivery_json) == (
        False,
        f"Run r1: not delivered ({NOT_DELIVERED_FAILED}).",
    )
    assert delivery_outcome("r1", {"state": "delivered"}) == (
        True,
        "Run r1: delivered.",
    )


def test_discard_deletes_only_the_runs_branch_and_its_kept_worktree(
    agent: FakeAgent, forge: Forge, tmp_path: Path, admin_client: Client
) -> None:
    project, origin = project_with_origin(tmp_path)
    git(project, "branch", "feature")
    git(project, "branch", "loopsweb/keep-me")
    agent.configure(steps={"worker": {"write": "half.txt", "exit": 3}})
    failed = run_task(project)
    assert failed.status == RunStatus.FAILED
    assert Path(failed.worktree_path).exists()
    agent.configure(steps={"worker": {"write": "note.txt"}})
    other = run_task(project)
    before = _branches(project)
    assert worktree_branch(failed.id) in before and worktree_branch(other.id) in before

    done = admin_client.post(reverse("ops:run-action", args=[failed.id, "discard"]))
    assert done.status_code == 302
    failed.refresh_from_db()
    assert (
        failed.work_discarded_at is not None and failed.worktree_removed_at is not None
    )
    assert not Path(failed.worktree_path).exists()
    assert _branches(project) == sorted(set(before) - {worktree_branch(failed.id)})
    # Twice is refused, nothing changed.
    with pytest.raises(CommandError, match="discarded already"):
        call_command("discard_run", failed.id)
    out = io.StringIO()
    call_command("discard_run", other.id, "--json", stdout=out)
    assert json.loads(out.getvalue())["deleted"] is True
    assert _branches(project) == ["feature", "loopsweb/keep-me", "main"]
    with pytest.raises(CommandError, match="run not found"):
        call_command("discard_run", "nope")


def test_prune_deletes_branches_of_runs_with_no_changes_and_of_closed_prs_only(
    agent: FakeAgent, forge: Forge, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_BRANCH_KEEP_SECONDS = 3600
    project, _ = project_with_origin(tmp_path)
    git(project, "branch", "loopsweb/run-notours")
    agent.configure(steps={})
    unchanged = run_task(project)
    agent.configure(steps={"worker": {"write": "a.txt"}})
    merged = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    agent.configure(steps={"worker": {"write": "b.txt"}})
    still_open = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    agent.configure(steps={"worker": {"write": "c.txt"}})
    kept = run_task(project)  # changed files, no PR: the operator's to discard
    forge.set_state(merged.delivery_json["pr"]["number"], "closed", merged=True)
    runs = [unchanged, merged, still_open, kept]
    assert unchanged.commit_diffstat == ""
    # Not yet older than the keep time: nothing goes.
    assert run_branches_prune() == []
    later = max(r.finished_at for r in runs) + timedelta(seconds=3601)
    dry = run_branches_prune(now=later, dry_run=True)
    assert sorted(d.run_id for d in dry) == sorted([unchanged.id, merged.id])
    # (The run that changed nothing lost its branch with its worktree already: merged.)
    assert all(worktree_branch(r.id) in _branches(project) for r in runs[1:])
    gone = run_branches_prune(now=later)
    assert {d.run_id: d.reason for d in gone} == {
        unchanged.id: "no changes",
        merged.id: "pull request merged",
    }
    branches = _branches(project)
    assert worktree_branch(unchanged.id) not in branches
    assert worktree_branch(merged.id) not in branches
    assert (
        worktree_branch(still_open.id) in branches
        and worktree_branch(kept.id) in branches
    )
    assert "loopsweb/run-notours" in branches and "main" in branches
    merged_row = WorkflowRun.objects.get(pk=merged.id)
    assert merged_row.work_discarded_at is not None
    assert merged_row.delivery_json["pr"]["state"] == "merged"


def test_the_run_admin_page_shows_the_work_and_its_action_discards_it(
    agent: FakeAgent, forge: Forge, tmp_path: Path, admin_client: Client
) -> None:
    project, _ = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "<i>x.txt"}})
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    page = admin_client.get(
        reverse("admin:ledger_workflowrun_change", args=[run.id])
    ).content.decode()
    worker = run.step_runs.get(step_id="worker")
    assert f"<code>{worker.commit_sha[:12]}</code> step worker" in page
    assert 'href="https://github.example/acme/widgets/pull/1"' in page
    assert "&lt;i&gt;x.txt" in page and "<i>x.txt" not in page
    done = admin_client.post(
        reverse("admin:ledger_workflowrun_changelist"),
        {"action": "discard_work", "_selected_action": [run.id]},
    )
    assert done.status_code == 302
    run.refresh_from_db()
    assert run.work_discarded_at is not None
    assert worktree_branch(run.id) not in _branches(project)
