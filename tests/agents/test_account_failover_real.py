"""An account's failure moves the step, never fails the task (issue 58, items 6-7), with the
REAL CLIs against the provider stand-in, the runner in this process (`run_workflow_run`, as
`manage.py run_workflow` calls it): the stand-in answers 401 to one pool member's key, or
never answers it (a hang: no progress for the route's idle limit); the step on that member
moves to a free one and the run succeeds there, the member marked `login failed` or
`unresponsive`.

A pool of three: the member that fails is the worker's, chosen after admission, so the
worker moves to the member no step of the run uses and the verifier keeps its own (worker ≠
verifier holds). The fake agent's tests of every path, and a pool of two through a
`manage.py run_workflow` process: tests/ledger/test_account_failover*.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from domain import reasons
from ledger.models import (
    Account,
    RunStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepAttempt,
)
from runs.runner import run_workflow_run
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.ledger.runner_helpers import git_project, route_generic, steps_of
from tests.waiting import hang_deadline

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db,
    pytest.mark.sqlite,  # the runner in this process: clis.on_each_cli says why
    pytest.mark.xdist_group("agent_clis_runner"),
]

KEYS = {
    "acct-a": "key-of-acct-a-0123",
    "acct-b": "key-of-acct-b-4567",
    "acct-c": "key-of-acct-c-89ab",
}
# The stand-in's mode for the failing member -> its attempt's status and the move's code.
FAILURES = {
    "401": ("login_failed", reasons.LOGIN_FAILED),
    "hang": ("unresponsive", reasons.UNRESPONSIVE),
}


def _idle_limit(provider: str, mode: str) -> int:
    """The route's idle limit. For a 401 it is only a ceiling: a hang deadline, so a busy
    machine never turns the 401 into a hang. For a hang it is what the hanging member waits
    before it moves, and the free member must show progress within it too, so it is sized
    for the CI machine with both suites running side by side, not for a quiet one: codex
    and claude print their start at once, but their first model answer through the sandbox
    took over 8 s there; opencode prints nothing at all until its first model call ends,
    about 6 s after its start on an idle machine, 16 s measured on a busy one, and over 45 s
    twice in a row in one CI run. Both are a hang deadline's share (scaled like one)."""
    if mode == "401":
        return round(hang_deadline(120))
    return round(hang_deadline(40 if provider != "opencode" else 100))


@pytest.mark.parametrize(
    ("provider", "mode"),
    [
        *clis.through_the_ledger(
            ("codex", "401"), ("codex", "hang"), ("claude", "401"), ("claude", "hang")
        ),
        # opencode's 401 and hang are its own output (a retried error line, no progress):
        # whether they move the step is proven here, on SQLite only (clis.on_each_cli).
        *clis.on_each_cli(("opencode", "401"), ("opencode", "hang")),
    ],
)
def test_a_failing_pool_member_moves_the_step_and_the_run_succeeds(
    provider: str,
    mode: str,
    binaries: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    settings: Any,
) -> None:
    settings.LOOPSWEB_KILL_GRACE_SECONDS = 1
    for name, key in KEYS.items():
        clis.register_account(provider, name, stand_in, tmp_path, key=key)
    project = git_project(tmp_path / "project")
    run: WorkflowRun = route_generic(
        project,
        title="Write agent-output.txt",
        message="Write the file agent-output.txt in the working directory.",
        created=True,
        provider=provider,
        auth_profile_pool=",".join(KEYS),
        step_idle_timeout=_idle_limit(provider, mode),
    ).run
    steps = steps_of(run)
    bad = steps["worker"].account_profile
    verifier = steps["verifier"].account_profile
    assert bad in KEYS and verifier in KEYS and bad != verifier
    stand_in.modes[KEYS[bad]] = mode

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED, WorkflowRun.objects.get(
        pk=run.id
    ).error
    status, code = FAILURES[mode]
    (free,) = set(KEYS) - {bad, verifier}
    worker = [
        (a.account_profile, a.status)
        for a in WorkflowStepAttempt.objects.filter(
            workflow_run=run, step_id="worker"
        ).order_by("started_at")
    ]
    assert worker == [(bad, status), (free, "succeeded")], worker
    moved = WorkflowEvent.objects.get(workflow_run=run, event_type="step_account_moved")
    assert (moved.payload_json["from"], moved.payload_json["to"]) == (bad, free)
    assert moved.payload_json["code"] == code
    assert steps_of(run)["verifier"].account_profile == verifier
    assert stand_in.model_calls(KEYS[free])
    account = Account.objects.get(pk=bad)
    if mode == "401":
        assert account.login_failed_at is not None
    else:
        assert account.unresponsive_until is not None
        assert "(idle limit)" in (account.unresponsive_reason or "")
