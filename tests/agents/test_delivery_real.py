"""From task to pull request with the REAL codex (issue 40, "done when"): a todos task
drained with `--deliver pull-request` over the pool of two accounts, run by the run cluster
(a process of its own) with the real codex against the provider stand-in; a bare
repository on local disk as the project's `origin` and the GitHub stand-in
(tests/forge_standin.py) on 127.0.0.1. It ends with the agent's file on `loopsweb/run-<id>`
in the remote, one commit per step that changed files with trailers naming step and
account, a pull request whose body names the task and every step's account, and the PR's
URL on the item page and in the API with the diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from ledger.models import RunStatus, WorkflowStepRun
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import bare_origin, drain_and_run, env_file
from tests.forge_standin import start_forge
from tests.ledger.runner_helpers import git

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("agent_clis"),
]

TOKEN = "ghp_real_codex_standin_token"


@pytest.mark.parametrize("provider", clis.on_each_cli("codex"))
def test_a_task_delivered_as_a_pull_request_by_the_real_codex(
    provider: str, cli_bin: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    origin, with_origin = bare_origin(tmp_path)
    token_file = env_file(tmp_path / "github.env", f"GITHUB_TOKEN={TOKEN}")
    forge, server = start_forge()
    try:
        run = drain_and_run(
            provider,
            cli_bin,
            stand_in,
            tmp_path,
            project_setup=with_origin,
            drain_args=("--deliver", "pull-request", "--github-repo", "acme/app"),
            env_extra={
                "LOOPSWEB_GITHUB_API_URL": forge.url,
                "LOOPSWEB_GITHUB_TOKEN_FILE": str(token_file),
                "LOOPSWEB_BASE_URL": "https://loops.example",
            },
        )
    finally:
        server.shutdown()
        server.server_close()
    steps = list(
        WorkflowStepRun.objects.filter(workflow_run_id=run.id).order_by("sequence")
    )
    assert run.status == RunStatus.SUCCEEDED, (run.error, [s.error for s in steps])
    delivery = run.delivery_json
    assert delivery["state"] == "delivered", delivery
    branch = run.worktree_branch
    assert (
        git(origin, "show", f"{branch}:{stand_in.file_name}") == stand_in.file_content
    )
    bodies = git(origin, "log", "--format=%B%x1e", f"main..{branch}").split("\x1e")
    commits = [b for b in bodies if b.strip()]
    changed = [s for s in steps if s.commit_sha]
    assert len(commits) == len(changed) >= 1
    for step in changed:
        assert any(
            f"Loopsweb-Step: {step.step_id}" in c
            and f"Loopsweb-Account: {step.account_profile}" in c
            for c in commits
        )
    [pull] = [r for r in forge.requests if r["method"] == "POST"]
    assert pull["authorization"] == f"Bearer {TOKEN}"
    body = pull["body"]["body"]
    assert "Write agent-output.txt" in body
    # The verifier's last message is what codex said, not loopsweb's line of its usage.
    said = body.split("The verifier's last message:")[1]
    assert f"```text\n{stand_in.final_text}\n```" in said and "turn done" not in said
    for step in steps:
        assert f"| {step.step_id} | {step.account_profile} |" in body
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    page = client.get(f"/ops/items/{run.work_item_id}/").content.decode()
    assert f'href="{delivery["pr"]["url"]}"' in page
    assert f"b/{stand_in.file_name}" in page
    api = client.get(f"/api/v1/work-items/{run.work_item_id}").json()
    assert api["runs"][0]["pullRequest"]["url"] == delivery["pr"]["url"]
    assert TOKEN not in page + json.dumps(api)
