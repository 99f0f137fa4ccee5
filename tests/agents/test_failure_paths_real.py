"""Failure paths with the REAL codex, claude and opencode against the provider stand-in
(issue 39): what ends a step that makes no progress, and a whole pool that is rate limited.

- A provider that keeps failing: opencode retries a server error many times, logging a
  `stream error` line each time; those lines are not progress, and the runner stops the
  step after LOOPSWEB_STEP_PROVIDER_ERRORS of them with the provider's error as the reason.
- A whole pool rate limited: every account answers 429; the task is held (its run parked,
  holding no run worker) and runs again, and the run succeeds once the provider answers
  again, through a real run cluster.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

from ledger.claims import COOLDOWN, PARKED_REASONS, TASK_PARKED
from ledger.models import AccountCooldown, RunStatus, StepStatus, WorkflowEvent
from runs.runner import run_workflow_run
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import KEYS, drain_and_run, route_run
from tests.ledger.runner_helpers import git_project, steps_of
from tests.waiting import hang_deadline

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("agent_clis_runner")]


@pytest.mark.sqlite  # the rule of clis.on_each_cli: opencode's rows run on SQLite only
@pytest.mark.django_db
def test_a_provider_that_keeps_failing_ends_the_step_with_its_error(
    binaries: Path, stand_in: ProviderStandIn, tmp_path: Path, settings: Any
) -> None:
    stand_in.mode = "500"
    settings.LOOPSWEB_KILL_GRACE_SECONDS = 1
    # Two in a row: the count, not the first error, ends the step (each more error is one
    # more of opencode's retries, about 1.5 s of CPU).
    settings.LOOPSWEB_STEP_PROVIDER_ERRORS = 2
    clis.register_account("opencode", "acct-a", stand_in, tmp_path, key="key-a-0123")
    project = git_project(tmp_path / "project")
    # An idle limit no step reaches here: what ends it is the provider's errors.
    run = route_run(
        project,
        "opencode",
        auth_profile="acct-a",
        step_idle_timeout=round(hang_deadline(600)),
    )

    assert run_workflow_run(run.id) == RunStatus.FAILED
    worker = steps_of(run)["worker"]
    assert worker.status == StepStatus.FAILED
    # The runner stops the CLI once it has seen two; the count it reports is every error
    # seen by then, and opencode's next retry can land before the stop (a busy machine).
    stopped = re.match(
        r"the provider failed (\d+) times in a row with no progress between: ",
        worker.error,
    )
    assert stopped is not None and int(stopped[1]) >= 2, worker.error
    assert "The server had an error" in worker.error, worker.error
    assert worker.progress_at is None  # it never got an answer
    posts = [r for r in stand_in.requests if r.method == "POST"]
    assert posts and {r.mode for r in posts} == {"500"}


@pytest.mark.django_db(transaction=True)
def test_a_whole_pool_rate_limit_holds_the_task_and_then_succeeds(
    cli_bin: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    """codex: both accounts answer 429; the step moves once, and the second account's
    report, one task's second, holds the task (ledger.claims rule 1: the one account it
    marked cools, the other is not marked) with the reason on record; the stand-in answers
    again once both accounts were refused, and the run succeeds once the hold is over.
    (The item is not failed at --max-attempts 1.)"""
    stand_in.retry_after = 3
    stand_in.modes.update({key: "429" for key in KEYS.values()})

    def answer_again() -> None:
        # Once every account has had its 429, the provider is back.
        while not stand_in._stopping.is_set():
            refused = {r.key for r in stand_in.requests if r.mode == "429"}
            if refused >= set(KEYS.values()):
                stand_in.modes.clear()
                return
            stand_in._stopping.wait(0.2)

    thread = threading.Thread(target=answer_again, daemon=True)
    thread.start()
    # codex names no reset: the first account cools, and the task is held, for the
    # backoff, short here.
    run = drain_and_run(
        "codex",
        cli_bin,
        stand_in,
        tmp_path,
        env_extra={"LOOPSWEB_COOLDOWN_BASE_SECONDS": "3"},
    )
    thread.join(5)

    assert run.status == RunStatus.SUCCEEDED, run.error
    waits = list(
        WorkflowEvent.objects.filter(
            workflow_run_id=run.id,
            event_type="step_waiting",
            payload_json__code=TASK_PARKED,
        )
    )
    assert waits, "the task was held"
    assert waits[0].payload_json["reason"].startswith(PARKED_REASONS[COOLDOWN])
    assert AccountCooldown.objects.count() == 1  # one task marks one account
    refused = [r for r in stand_in.requests if r.mode == "429"]
    answered = [r for r in stand_in.model_calls() if r.mode == "ok"]
    assert {r.key for r in refused} == set(KEYS.values())
    assert answered and min(r.at for r in answered) > max(r.at for r in refused)
