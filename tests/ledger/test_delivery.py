"""Delivery of a run's work (issue 40 item 2): real git with a bare repository on local disk
as the project's `origin`, a GitHub stand-in on 127.0.0.1 (tests/forge_standin.py), the
fake agent (and the hostile one) in this process."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.models import RunStatus, WorkflowEvent, WorkflowRun
from runs.runner import run_workflow_run
from runs.worktrees import worktree_branch
from tests.forge_standin import Forge
from tests.ledger.delivery_helpers import (
    TOKEN,
    project_with_origin,
    remote_branches,
    run_task,
)
from tests.ledger.runner_helpers import FakeAgent, git, route_generic

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

HOSTILE_AGENT = Path(__file__).resolve().parents[1] / "hostile_agent.py"


def test_pull_request_delivery_pushes_the_branch_and_opens_a_pr_with_the_runs_story(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, origin = project_with_origin(tmp_path)
    agent.configure(
        steps={
            "worker": {"write": "note.txt"},
            "verifier": {"output": "VERIFIED: the note is there"},
        }
    )
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert run.status == RunStatus.SUCCEEDED
    branch = worktree_branch(run.id)
    # The agent's file is on loopsweb/run-<id> in the bare remote, at the run's head.
    assert remote_branches(origin)[branch] == run.commit_head
    assert git(origin, "show", f"{branch}:note.txt") == run.id
    [request] = forge.requests
    assert (request["method"], request["path"]) == ("POST", "/repos/acme/widgets/pulls")
    assert request["authorization"] == f"Bearer {TOKEN}"
    body = request["body"]
    assert (body["head"], body["base"], body["draft"]) == (branch, "main", False)
    assert body["title"] == "Add the note"
    text = body["body"]
    assert "Add the note" in text and run.id in text
    for step in run.step_runs.all():
        assert f"| {step.step_id} | {step.account_profile or '-'} |" in text
    assert "VERIFIED: the note is there" in text
    assert f"https://loops.example/ops/items/{run.work_item_id}/" in text
    delivery = run.delivery_json
    assert delivery["state"] == "delivered" and delivery["error"] is None
    assert (delivery["ref"], delivery["commit"]) == (
        f"refs/heads/{branch}",
        run.commit_head,
    )
    assert delivery["pr"]["number"] == 1
    assert delivery["pr"]["url"] == "https://github.example/acme/widgets/pull/1"
    assert delivery["pr"]["state"] == "open"
    # The token is in no row: not in the run, not in its events.
    events = list(
        WorkflowEvent.objects.filter(workflow_run_id=run.id).values_list(
            "payload_json", flat=True
        )
    )
    assert TOKEN not in json.dumps(delivery) + json.dumps(events)
    assert "delivered" in WorkflowEvent.objects.filter(
        workflow_run_id=run.id
    ).values_list("event_type", flat=True)


def test_push_delivery_pushes_only_the_runs_branch(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, origin = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    before = remote_branches(origin)
    run = run_task(project, deliver="push")
    assert run.status == RunStatus.SUCCEEDED
    after = remote_branches(origin)
    assert after == {**before, worktree_branch(run.id): run.commit_head}
    assert run.delivery_json["state"] == "delivered" and "pr" not in run.delivery_json
    assert forge.requests == []


def test_the_default_keeps_the_branch_and_pushes_nothing(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, origin = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    before = remote_branches(origin)
    run = run_task(project)
    assert run.status == RunStatus.SUCCEEDED
    assert remote_branches(origin) == before and forge.requests == []
    assert (
        run.delivery_json["mode"] == "branch" and run.delivery_json["state"] == "kept"
    )


@pytest.mark.parametrize(
    ("status", "answer", "message"),
    [
        (401, {"message": "Bad credentials"}, "GitHub answered 401: Bad credentials"),
        (
            422,
            {
                "message": "Validation Failed",
                "errors": [{"message": "No commits between main and x"}],
            },
            "GitHub answered 422: Validation Failed; No commits between main and x",
        ),
        (502, {"message": "Server Error"}, "GitHub answered 502: Server Error"),
    ],
)
def test_a_forge_refusal_fails_the_delivery_not_the_run_and_deliver_again_retries(
    agent: FakeAgent,
    forge: Forge,
    tmp_path: Path,
    status: int,
    answer: dict[str, Any],
    message: str,
) -> None:
    project, origin = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    forge.fail_next(status, answer)
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert run.status == RunStatus.SUCCEEDED and run.error is None
    assert run.delivery_json["state"] == "failed"
    assert run.delivery_json["error"] == f"delivery failed: {message}"
    assert worktree_branch(run.id) in remote_branches(
        origin
    )  # pushed before the refusal
    types = list(
        WorkflowEvent.objects.filter(workflow_run_id=run.id).values_list(
            "event_type", flat=True
        )
    )
    assert "delivery_failed" in types

    out = io.StringIO()
    call_command("deliver_run", run.id, "--json", stdout=out)
    record = json.loads(out.getvalue())
    assert record["state"] == "delivered" and record["pr"]["number"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.delivery_json["pr"]["number"] == 1
    posts = [r for r in forge.requests if r["method"] == "POST"]
    assert len(posts) == 2 and len(forge.pulls) == 1
    # Delivered: nothing to deliver again, and no second pull request.
    with pytest.raises(CommandError, match="nothing to deliver again"):
        call_command("deliver_run", run.id)
    assert len(forge.pulls) == 1


def test_a_refused_push_fails_the_delivery_and_opens_no_pull_request(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, origin = project_with_origin(tmp_path)
    # A hook of the remote refuses every push (the remote's own, which is git's to run).
    hook = origin / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'pushes are closed today' >&2\nexit 1\n")
    hook.chmod(0o755)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert run.status == RunStatus.SUCCEEDED
    error = run.delivery_json["error"]
    assert error.startswith("delivery failed: git push to ") and "refused" in error
    assert forge.requests == []
    with pytest.raises(CommandError, match="delivery failed"):
        call_command("deliver_run", run.id)


def test_a_failed_run_is_delivered_only_with_deliver_failed_and_then_as_a_draft(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, origin = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}, "verifier": {"exit": 2}})
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert run.status == RunStatus.FAILED
    assert run.delivery_json["state"] == "skipped" and forge.requests == []
    assert worktree_branch(run.id) not in remote_branches(origin)

    run = run_task(
        project, deliver="pull-request", github_repo="acme/widgets", deliver_failed=True
    )
    assert run.status == RunStatus.FAILED
    assert run.delivery_json["state"] == "delivered"
    [request] = forge.requests
    assert request["body"]["draft"] is True


def test_no_token_file_fails_the_delivery_with_a_clear_message(
    agent: FakeAgent, forge: Forge, tmp_path: Path, settings: Any
) -> None:
    project, _ = project_with_origin(tmp_path)
    loose = tmp_path / "loose.env"
    loose.write_text(f"GITHUB_TOKEN={TOKEN}\n")
    loose.chmod(0o644)
    settings.LOOPSWEB_GITHUB_TOKEN_FILE = str(loose)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert run.status == RunStatus.SUCCEEDED
    assert (
        "must be 0600" in run.delivery_json["error"]
        and TOKEN not in run.delivery_json["error"]
    )
    assert forge.requests == []


def test_a_hostile_agents_push_config_runs_nothing_and_sends_nothing_to_its_url(
    forge: Forge, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, origin = project_with_origin(tmp_path)
    decoy = tmp_path / "decoy.git"
    git(tmp_path, "init", "-q", "--bare", str(decoy))
    hostile = tmp_path / "hostile"
    settings.LOOPSWEB_PROVIDER_BINARIES = {
        p: str(HOSTILE_AGENT) for p in settings.LOOPSWEB_PROVIDER_BINARIES
    }
    settings.LOOPSWEB_AGENT_ENV_PASSTHROUGH = ("HOSTILE_*",)
    monkeypatch.setenv("HOSTILE_DIR", str(hostile))
    monkeypatch.setenv("HOSTILE_DECOY_URL", str(decoy))
    monkeypatch.setenv(
        "PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    run = route_generic(
        project,
        message="HOSTILE_CASES=push-config",
        created=True,
        deliver="pull-request",
        github_repo="acme/widgets",
    ).run
    run_workflow_run(run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    # The agent did plant its config (else this test proves nothing) ...
    planted = git(project, "config", "--get", "remote.origin.url").strip()
    assert planted == str(decoy)
    # ... and loopsweb ran none of it and sent nothing to its URL.
    assert not (hostile / "marks").exists(), (hostile / "marks").read_text()
    assert remote_branches(decoy) == {}
    assert remote_branches(origin)[worktree_branch(run.id)] == run.commit_head
    assert run.delivery_json["state"] == "delivered"
    assert run.delivery_json["url"] == str(origin)


def test_a_pull_request_opened_before_an_answer_was_lost_is_adopted_not_doubled(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, _ = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert run.delivery_json["pr"]["number"] == 1
    # As if the forge's 201 never reached loopsweb: the run knows of no pull request.
    lost = {k: v for k, v in run.delivery_json.items() if k != "pr"}
    WorkflowRun.objects.filter(pk=run.id).update(
        delivery_json={**lost, "state": "failed", "error": "delivery failed: timed out"}
    )
    out = io.StringIO()
    call_command("deliver_run", run.id, "--json", stdout=out)
    record = json.loads(out.getvalue())
    assert record["state"] == "delivered" and record["pr"]["number"] == 1
    assert len(forge.pulls) == 1
    assert [(r["method"], r["path"]) for r in forge.requests[-2:]] == [
        ("POST", "/repos/acme/widgets/pulls"),
        ("GET", "/repos/acme/widgets/pulls"),
    ]
    assert (
        forge.requests[-1]["query"]
        == f"head=acme%3A{worktree_branch(run.id).replace('/', '%2F')}&state=all"
    )


def test_deliver_none_keeps_nothing_of_a_succeeded_run(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, origin = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    before = remote_branches(origin)
    run = run_task(project, deliver="none")
    assert run.status == RunStatus.SUCCEEDED
    branches = git(project, "branch", "--list", "--format=%(refname:short)").split()
    assert worktree_branch(run.id) not in branches and "main" in branches
    assert run.work_discarded_at is not None and run.delivery_json["mode"] == "none"
    assert remote_branches(origin) == before and forge.requests == []


def _reviewed_run(project: Path, reviewers: str) -> WorkflowRun:
    return run_task(
        project,
        deliver="pull-request",
        github_repo="acme/widgets",
        github_reviewer=reviewers,
    )


def _reviewer_requests(forge: Forge) -> list[dict[str, Any]]:
    return [r for r in forge.requests if r["path"].endswith("/requested_reviewers")]


def test_github_reviewer_asks_for_reviews_on_the_pr_it_opens_and_records_them(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, _ = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    run = _reviewed_run(project, "mona,hubot")
    assert run.status == RunStatus.SUCCEEDED
    opened, asked = forge.requests
    assert (opened["method"], opened["path"]) == ("POST", "/repos/acme/widgets/pulls")
    assert (asked["method"], asked["path"]) == (
        "POST",
        "/repos/acme/widgets/pulls/1/requested_reviewers",
    )
    assert asked["body"] == {"reviewers": ["mona", "hubot"]}
    assert asked["authorization"] == f"Bearer {TOKEN}"
    delivery = run.delivery_json
    assert delivery["state"] == "delivered" and delivery["reviewers"] == [
        "mona",
        "hubot",
    ]
    assert "notes" not in delivery
    assert forge.pulls[1]["requested_reviewers"] == [
        {"login": "mona"},
        {"login": "hubot"},
    ]
    # A push route asks nobody: the option is the pull request's.
    push = run_task(project, deliver="push", github_reviewer="mona")
    assert push.delivery_json["state"] == "delivered"
    assert len(_reviewer_requests(forge)) == 1 and "reviewers" not in push.delivery_json


def test_a_refused_review_request_is_a_note_and_the_delivery_and_run_stand(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    project, _ = project_with_origin(tmp_path)
    forge.collaborators = {"mona"}
    agent.configure(steps={"worker": {"write": "note.txt"}})
    run = _reviewed_run(project, "mona,stranger")
    assert run.status == RunStatus.SUCCEEDED
    delivery = run.delivery_json
    assert delivery["state"] == "delivered" and delivery["error"] is None
    assert delivery["pr"]["number"] == 1 and "reviewers" not in delivery
    [note] = delivery["notes"]
    assert note.startswith(
        "reviewers mona,stranger not requested: GitHub answered 422:"
    )
    assert "not a collaborator of the acme/widgets repository" in note
    assert "requested_reviewers" not in forge.pulls[1]
    [event] = WorkflowEvent.objects.filter(
        workflow_run_id=run.id, event_type="delivered"
    ).values_list("payload_json", flat=True)
    assert event["notes"] == [note]
    assert TOKEN not in json.dumps(delivery)


def test_a_remote_rewritten_after_the_first_delivery_is_refused_with_the_reason(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    """The push URL is pinned per project on its first delivery: a later run that reads
    another URL from the project's config (as an agent could have written it) is refused."""
    project, origin = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    first = run_task(project, deliver="push")
    assert first.delivery_json["state"] == "delivered"
    decoy = tmp_path / "decoy.git"
    git(tmp_path, "init", "-q", "--bare", str(decoy))
    git(project, "config", "remote.origin.pushurl", str(decoy))
    agent.configure(steps={"worker": {"write": "other.txt"}})
    second = run_task(project, deliver="push")
    assert second.status == RunStatus.SUCCEEDED  # the run stands; its delivery does not
    assert second.delivery_json["state"] == "failed"
    error = second.delivery_json["error"]
    assert f"now names {decoy}" in error and str(origin) in error
    assert remote_branches(decoy) == {}
    # Deliver again refuses too: the URL recorded for the run is not the pinned one.
    from runs.delivery import deliver_run

    assert deliver_run(second.id)["state"] == "failed"
    assert remote_branches(decoy) == {}
    assert worktree_branch(second.id) not in remote_branches(origin)


def test_work_holding_a_secret_loopsweb_keeps_is_not_committed_nor_shown(
    tmp_path: Path, settings: Any
) -> None:
    """An agent that finds one of loopsweb's secrets (the GitHub token here) and writes it
    into its work and its output: the output is stored redacted, and the file is never
    committed or pushed; the run says why and where the files are kept."""
    from ledger.held_secrets import held_secrets_forget

    token_file = tmp_path / "github.env"
    token_file.write_text(f"GITHUB_TOKEN={TOKEN}\n")
    token_file.chmod(0o600)
    settings.LOOPSWEB_GITHUB_TOKEN_FILE = str(token_file)
    held_secrets_forget()
    leaker = tmp_path / "leaker"
    leaker.write_text(
        f"#!/bin/sh\nprintf '%s\\n' 'token: {TOKEN}' > leak.txt\necho 'found {TOKEN}'\n"
    )
    leaker.chmod(0o755)
    settings.LOOPSWEB_PROVIDER_BINARIES = {
        p: str(leaker) for p in settings.LOOPSWEB_PROVIDER_BINARIES
    }
    project, origin = project_with_origin(tmp_path)
    run = run_task(project, deliver="push")
    worker = run.step_runs.get(step_id="worker")
    assert TOKEN not in worker.stdout
    assert "[redacted:github:GITHUB_TOKEN]" in worker.stdout
    assert run.commit_error is not None
    assert (
        "leak.txt holds a secret loopsweb keeps (github:GITHUB_TOKEN)"
        in run.commit_error
    )
    assert TOKEN not in run.commit_error
    kept = Path(run.worktree_path or "")
    assert (
        TOKEN in (kept / "leak.txt").read_text()
    )  # kept for the operator, not committed
    assert worktree_branch(run.id) not in remote_branches(origin)
    held_secrets_forget()
