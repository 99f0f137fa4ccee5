"""Real runs: a drained task, run by the run cluster (`Q_CLUSTER_NAME=loopsweb-runs manage.py
qcluster`, a process of its own), with the REAL codex, claude and opencode against the provider
stand-in, over a pool of two registered accounts (each its own login directory and key).

What each test shows (issue 26): each step's requests carried the key of the account its step
run records; the file the agent wrote is on the run's branch after the worktree is gone (the
runner committed it); the usage on each step equals what the stand-in reported, and lands on
`/ops/accounts/`; the keys are nowhere in the database or on the pages.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from agents.agent_message import final_message
from agents.agent_output import summarize_output
from ledger.models import RunStatus, WorkflowStepRun
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import KEYS, drain_and_run
from tests.ledger.runner_helpers import git

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("agent_clis"),
]

PROVIDERS = clis.on_each_cli(*clis.REAL_CLIS)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_drained_task_runs_worker_and_verifier_with_the_real_cli(
    provider: str, cli_bin: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    run = drain_and_run(provider, cli_bin, stand_in, tmp_path)
    steps = {
        s.step_id: s for s in WorkflowStepRun.objects.filter(workflow_run_id=run.id)
    }
    assert run.status == RunStatus.SUCCEEDED, (
        run.error,
        {k: (s.error, (s.stdout or "")[-1500:]) for k, s in steps.items()},
    )
    assert {s.account_profile for s in steps.values()} == set(KEYS)
    for step in steps.values():
        key = KEYS[step.account_profile]
        calls = stand_in.model_calls(key)
        assert calls, f"no model call carried {step.account_profile}'s key"
        reported = stand_in.reported(key)
        # One step per account: the step's usage is what the stand-in told that key.
        assert (
            step.usage_input_tokens,
            step.usage_output_tokens,
            step.usage_cached_tokens,
        ) == (
            reported["input_tokens"],
            reported["output_tokens"],
            reported["cached_tokens"],
        ), step.step_id
    assert stand_in.keys_seen() <= set(KEYS.values())
    # What the pages show of the worker's output: its tool call and its final message.
    live = summarize_output(provider, steps["worker"].stdout or "")
    assert stand_in.file_name in live and stand_in.final_text in live, live[-1500:]
    # Each step's own last words (the pull request's "verifier's last message").
    for step in steps.values():
        assert final_message(provider, step.stdout) == stand_in.final_text, step.step_id
    # The worktree is gone; the agent's file is on the run's branch (committed by the run).
    project = tmp_path / "project"
    assert not Path(run.worktree_path).exists()
    branch = run.worktree_branch
    assert git(project, "show", f"{branch}:{stand_in.file_name}") == (
        stand_in.file_content
    )
    assert git(project, "rev-parse", branch).strip() == run.commit_head
    assert stand_in.file_name in run.commit_diffstat
    # The pages: usage per account, the run's branch; never a key.
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    accounts = client.get("/ops/accounts/").content.decode()
    run_page = client.get(
        f"/admin/ledger/workflowrun/{run.id}/change/"
    ).content.decode()
    # The command runs nothing an agent may have planted in the project's config.
    assert f"core.fsmonitor=false switch {branch}" in run_page
    assert "core.hooksPath=/dev/null" in run_page
    for step in steps.values():
        assert (
            f"{step.usage_input_tokens:,}" in accounts
            or str(step.usage_input_tokens) in accounts
        )
    for key in KEYS.values():
        assert key not in accounts and key not in run_page
        for row in WorkflowStepRun.objects.values_list("stdout", "stderr", "error"):
            assert all(key not in (text or "") for text in row)
