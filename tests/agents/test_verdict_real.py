"""A verifier's verdict read from what each REAL CLI prints (docs/revisions.md §1; issue 60):
codex, claude and opencode against the provider stand-in, the runner in this process. The
stand-in's final text ends with `VERDICT: changes` and the findings; the verifier step records
that verdict and its findings from the CLI's own final message (codex's last agent message,
claude's `result`, opencode's last text), and the run's end asks for a revision with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger.models import RevisionState, RunStatus, WorkItemRevision
from runs.runner import run_workflow_run
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import route_run
from tests.ledger.runner_helpers import git_project, steps_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db,
    pytest.mark.sqlite,  # the runner in this process: clis.on_each_cli says why
    pytest.mark.xdist_group("agent_clis_runner"),
]

FINDINGS = "- agent-output.txt has no trailing summary line\n- add a test for it"


@pytest.mark.parametrize("provider", clis.on_each_cli(*clis.REAL_CLIS))
def test_the_verifiers_verdict_and_findings_come_from_the_clis_own_final_message(
    provider: str,
    binaries: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    settings: Any,
) -> None:
    stand_in.final_text = f"I checked the file.\n\nVERDICT: changes\n{FINDINGS}"
    clis.register_account(
        provider, "acct-a", stand_in, tmp_path, key="key-of-acct-a-0123"
    )
    project = git_project(tmp_path / "project")
    run = route_run(project, provider, auth_profile="acct-a")
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    verifier = steps_of(run)["verifier"]
    assert verifier.verdict == "changes", (verifier.verdict, verifier.stdout)
    assert verifier.verdict_text == FINDINGS
    assert steps_of(run)["worker"].verdict is None  # only a verifier gives one
    [revision] = WorkItemRevision.objects.filter(work_item_id=run.work_item_id)
    assert (revision.trigger, revision.state) == ("verdict", RevisionState.WAITING)
    assert revision.findings == FINDINGS
