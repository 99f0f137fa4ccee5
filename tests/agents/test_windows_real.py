"""Rate-limit windows with the REAL CLIs against the provider stand-in sending the window
headers (docs/windows.md §1): the runner records what codex's rollout and claude's
`rate_limit_event` say, for the account the step ran on; an account the stand-in reports
spent gets no further step.

In this process (`run_workflow_run`, as `manage.py run_workflow` calls it); the same through
the run cluster and drain processes is tests/agents/test_windows_processes.py.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from domain.keys import generic_pool_seed
from domain.pool import stable_index
from ledger.models import (
    AccountWindow,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
)
from runs.runner import run_workflow_run
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import route_run
from tests.ledger.runner_helpers import (
    git_project,
    kill_group_quietly,
    spawn_runner,
    steps_of,
)
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db,
    pytest.mark.sqlite,  # the runner in this process: clis.on_each_cli says why
    pytest.mark.xdist_group("agent_clis_runner"),
]

KEYS = {"acct-a": "sk-ant-oat01-key-of-acct-a", "acct-b": "sk-ant-oat01-key-of-acct-b"}
# A third account, fresh: worker ≠ verifier needs two accounts once acct-a is left out.
KEY_C = "sk-ant-oat01-key-of-acct-c"
POOL3 = "acct-a,acct-b,acct-c"


def _worker_on_acct_a_of_three() -> str:
    """An event id whose pool seed puts the worker on acct-a of a pool of three (the
    verifier on acct-b)."""
    for n in itertools.count():
        event_id = f"evt-{time.time_ns()}-{n}"
        if stable_index(generic_pool_seed("ci", "build.failed", event_id), 3) == 0:
            return event_id
    raise AssertionError("unreachable")


SOURCES = {"codex": "codex rollout", "claude": "claude rate_limit_event"}


@pytest.mark.parametrize("provider", clis.on_each_cli("codex", "claude"))
def test_each_steps_window_is_recorded_for_its_account(
    provider: str, binaries: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    # claude reports a number only at warning levels: acct-a at 93 % (warning), acct-b 42 %.
    stand_in.windows = {KEYS["acct-a"]: 0.93, KEYS["acct-b"]: 0.42}
    for name, key in KEYS.items():
        clis.register_account(provider, name, stand_in, tmp_path, key=key, oauth=True)
    project = git_project(tmp_path / "project")
    run = route_run(project, provider, auth_profile_pool="acct-a,acct-b")

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED, WorkflowRun.objects.get(
        pk=run.id
    ).error

    steps = steps_of(run)
    assert {s.account_profile for s in steps.values()} == set(KEYS)
    reset = stand_in._window_epoch + stand_in.window_reset_seconds
    rows = {
        (r.account_profile, r.window): r
        for r in AccountWindow.objects.filter(source=SOURCES[provider])
    }
    a = rows[("acct-a", "5h")]
    assert a.used == pytest.approx(0.93)
    assert int(a.resets_at.timestamp()) == reset
    assert a.step_run_id in {s.id for s in steps.values()}
    b = rows[("acct-b", "5h")]
    assert int(b.resets_at.timestamp()) == reset
    if provider == "codex":  # exact, from every answer, both windows
        assert b.used == pytest.approx(0.42)
        assert rows[("acct-a", "7d")].used == pytest.approx(0.17)
    else:  # claude: allowed carries no number; the warning does
        assert (a.status, b.status, b.used) == ("allowed_warning", "allowed", None)

    # acct-a is past --max-window-used (0.9): the next run's steps go to acct-b and a
    # third account (worker ≠ verifier), never acct-a.
    clis.register_account(provider, "acct-c", stand_in, tmp_path, key=KEY_C, oauth=True)
    second = route_run(project, provider, auth_profile_pool=POOL3)
    assert {s.account_profile for s in steps_of(second).values()} == {
        "acct-b",
        "acct-c",
    }


@pytest.mark.sqlite
def test_opencode_tells_nothing_before_a_429_and_the_429_is_recorded(
    binaries: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    """opencode reads no window on success; at a spent window (the stand-in's 429 with the
    headers) the runner stops it as soon as its log names the limit, before opencode prints
    its error line, so what is recorded is the 429 the runner saw: rejected until the
    cooldown's end. The worker moves to acct-c (the verifier, on acct-b, is another
    account: worker ≠ verifier)."""
    stand_in.windows = {KEYS["acct-a"]: 1.0, KEYS["acct-b"]: 0.3, KEY_C: 0.3}
    stand_in.retry_after = 120
    for name, key in {**KEYS, "acct-c": KEY_C}.items():
        clis.register_account("opencode", name, stand_in, tmp_path, key=key)
    project = git_project(tmp_path / "project")
    run = route_run(
        project, "opencode", _worker_on_acct_a_of_three(), auth_profile_pool=POOL3
    )
    assert steps_of(run)["worker"].account_profile == "acct-a"

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED, WorkflowRun.objects.get(
        pk=run.id
    ).error

    steps = steps_of(run)
    assert (steps["worker"].account_profile, steps["verifier"].account_profile) == (
        "acct-c",
        "acct-b",
    )
    spent = AccountWindow.objects.get(account_profile="acct-a")
    assert (spent.window, spent.status) == ("rate_limit", "rejected")
    assert not AccountWindow.objects.filter(
        account_profile__in=["acct-b", "acct-c"]
    ).exists()


@pytest.mark.parametrize("provider", clis.on_each_cli("codex", "claude"))
@pytest.mark.django_db(transaction=True)
def test_the_window_is_recorded_while_the_step_still_runs(
    provider: str, binaries: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    """codex writes its rollout after the first answer, claude prints its event after the
    first answer: the runner (its own process, flushing every second) records the window
    while the final answer still streams."""
    stand_in.mode = "slow"
    stand_in.slow_seconds = 8
    # The answer streams on until the window is seen: the runner cannot end before.
    stand_in.slow_hold = threading.Event()
    stand_in.windows = {KEYS["acct-a"]: 0.93}
    clis.register_account(
        provider, "acct-a", stand_in, tmp_path, key=KEYS["acct-a"], oauth=True
    )
    project = git_project(tmp_path / "project")
    run = route_run(project, provider, auth_profile="acct-a")
    proc = spawn_runner(
        run.id,
        extra_env={
            "LOOPSWEB_OUTPUT_FLUSH_SECONDS": "1",
            f"LOOPSWEB_{provider.upper()}_BIN": str(
                binaries / clis.CLI_PACKAGES[provider][2]
            ),
        },
    )
    try:

        def recorded_while_running() -> AccountWindow | None:
            assert proc.poll() is None, "the runner ended before the window was seen"
            worker = WorkflowStepRun.objects.get(workflow_run=run, step_id="worker")
            row = AccountWindow.objects.filter(
                account_profile="acct-a", window="5h", source=SOURCES[provider]
            ).first()
            return (
                row if row is not None and worker.status == StepStatus.RUNNING else None
            )

        row = wait_for(
            recorded_while_running,
            timeout=120,
            interval=0.5,
            what="the window to be recorded while the step runs",
        )
        assert row.used == pytest.approx(0.93)
        stand_in.slow_hold.set()
        proc.wait(timeout=120)
    finally:
        stand_in.slow_hold.set()
        kill_group_quietly(proc.pid)
