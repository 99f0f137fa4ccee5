"""One round of the loop with the REAL codex (docs/revisions.md; issue 60, "tests"): a todos
task drained with `--deliver pull-request` and run by the run cluster (a process of its own)
with the real codex against the provider stand-in opens a pull request on the GitHub
stand-in; a reviewer then requests changes (a signed `pull_request_review` webhook to
`POST /hooks/github/`); the revision's run, by the same run cluster and the real codex, is
told the review, changes the file and pushes onto the same branch: the pull request is
updated, no second one is opened."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from ledger.models import (
    RevisionState,
    RunStatus,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemRevision,
)
from routing.revisions import revisions_start_due
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import bare_origin, drain_and_run, env_file, run_env
from tests.forge_standin import start_forge
from tests.ledger.runner_helpers import git
from tests.processes import start_qcluster, stop_process_group, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("agent_clis"),
]

TOKEN = "ghp_real_codex_revision_token"
SECRET = "real-codex-hook-secret"
REVIEW = "Please end the file with the words: revised after review."
REVISED = "revised after review\n"


def _signed_review(number: int, commit: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {
            "action": "submitted",
            "review": {
                "id": 4242,
                "state": "changes_requested",
                "body": REVIEW,
                "commit_id": commit,
                "user": {"login": "reviewer", "type": "User"},
                "author_association": "OWNER",
            },
            "pull_request": {"number": number, "head": {"sha": commit}},
            "repository": {"full_name": "acme/app"},
        }
    ).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "HTTP_X_GITHUB_EVENT": "pull_request_review",
        "HTTP_X_GITHUB_DELIVERY": "real-codex-review-1",
        "HTTP_X_HUB_SIGNATURE_256": f"sha256={signature}",
    }


@pytest.mark.parametrize("provider", clis.on_each_cli("codex"))
def test_the_real_codex_revises_its_pull_request_after_changes_are_requested(
    provider: str,
    cli_bin: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    settings: Any,
) -> None:
    origin, with_origin = bare_origin(tmp_path)
    token_file = env_file(tmp_path / "github.env", f"GITHUB_TOKEN={TOKEN}")
    hook_file = env_file(tmp_path / "hook.env", f"GITHUB_WEBHOOK_SECRET={SECRET}")
    forge, server = start_forge()
    extra = {
        "LOOPSWEB_GITHUB_API_URL": forge.url,
        "LOOPSWEB_GITHUB_TOKEN_FILE": str(token_file),
    }
    # This process answers the webhook and starts the round, as the web server and the
    # main cluster would.
    settings.LOOPSWEB_GITHUB_API_URL = forge.url
    settings.LOOPSWEB_GITHUB_TOKEN_FILE = str(token_file)
    settings.LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE = str(hook_file)
    settings.LOOPSWEB_REVISION_DEBOUNCE_SECONDS = 0
    try:
        first = drain_and_run(
            provider,
            cli_bin,
            stand_in,
            tmp_path,
            project_setup=with_origin,
            drain_args=("--deliver", "pull-request", "--github-repo", "acme/app"),
            env_extra=extra,
        )
        assert first.status == RunStatus.SUCCEEDED, first.error
        assert first.delivery_json["pr"]["number"] == 1, first.delivery_json
        branch = first.worktree_branch
        forge.pulls[1]["head"]["sha"] = first.commit_head  # GitHub follows the push

        body, headers = _signed_review(1, first.commit_head)
        answer = Client().post(
            "/hooks/github/", data=body, content_type="application/json", **headers
        )
        assert answer.status_code == 200 and "revision" in answer.json()["outcome"]
        stand_in.file_content = (
            REVISED  # the round's codex writes what the review asked
        )
        cluster = start_qcluster(
            run_env(provider, cli_bin, **extra),
            tmp_path / "runs-2.log",
            cluster="loopsweb-runs",
        )
        try:
            [started] = revisions_start_due()
            assert "round 1 of 2" in started, started
            item = WorkflowWorkItem.objects.get(pk=first.work_item_id)
            second_id = item.workflow_run_id

            def ended() -> WorkflowRun | None:
                """The round's run once it ended and its delivery was tried."""
                assert cluster.poll() is None, (tmp_path / "runs-2.log").read_text()
                run = WorkflowRun.objects.get(pk=second_id)
                over = run.status in (RunStatus.FAILED, RunStatus.TIMED_OUT)
                tried = (run.delivery_json or {}).get("state") is not None
                return (
                    run
                    if over or (run.status == RunStatus.SUCCEEDED and tried)
                    else None
                )

            second = wait_until(ended, timeout=240, what="the revision's run to end")
        finally:
            stop_process_group(cluster)
    finally:
        server.shutdown()
        server.server_close()
    assert second.status == RunStatus.SUCCEEDED, second.error
    revision = WorkItemRevision.objects.get()
    assert (revision.state, revision.round, revision.run_id) == (
        RevisionState.STARTED,
        1,
        second.id,
    )
    # The real codex was told the review, fenced as data.
    prompts = json.dumps([call.body for call in stand_in.model_calls()])
    assert REVIEW in prompts and "revision 1 of at most 2" in prompts
    # Pushed onto the pull request's branch, a fast-forward; the same pull request.
    assert (
        git(origin, "rev-parse", f"refs/heads/{branch}").strip() == second.commit_head
    )
    assert (
        git(origin, "show", f"{branch}:{stand_in.file_name}").strip() == REVISED.strip()
    )
    git(origin, "merge-base", "--is-ancestor", first.commit_head, second.commit_head)
    assert len([r for r in forge.requests if r["path"].endswith("/pulls")]) == 1
    assert second.delivery_json["state"] == "delivered", second.delivery_json
    assert second.delivery_json["pr"]["number"] == 1
