"""The runner with the real CLIs against the provider stand-in, in this process (one run per
test, `run_workflow_run` as `manage.py run_workflow` calls it) or, where a test reads the
ledger while the step still runs, in a `manage.py run_workflow` process.

What each shows (issue 26): a 429 account cools until the provider's reset and the step moves
to the other pool member and succeeds, and the verifier, whose only free account is then the
worker's, waits for the cooling one instead (worker ≠ verifier, issue 58); a hang fails at the idle timeout naming it, with the
output seen so far; a 401 (codex, opencode) and a claude account with no login fail with the
CLI's own message and the exit code, and mark the account login failed; a slow answer's
output is in the step run while the step still runs; a run with no changes says so. The 429
and slow-answer tests are about the ledger, so they run without opencode
(`clis.through_the_ledger`).
"""

from __future__ import annotations

import io
import itertools
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from domain.keys import generic_pool_seed
from domain.pool import stable_index
from ledger.models import (
    Account,
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepAttempt,
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
from tests.routing.api.helpers import bearer, make_token
from tests.waiting import hang_deadline, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db,
    pytest.mark.sqlite,  # the runner in this process: clis.on_each_cli says why
    # One real CLI at a time per group; this file's timed runs beside the other CLI tests.
    pytest.mark.xdist_group("agent_clis_runner"),
]

PROVIDERS = clis.on_each_cli(*clis.REAL_CLIS)
KEY_A, KEY_B = "key-of-acct-a-0123", "key-of-acct-b-4567"


def _staff_page(path: str) -> str:
    user, _ = get_user_model().objects.get_or_create(
        username="op", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    response = client.get(path)
    assert response.status_code == 200, path
    return response.content.decode()


def _worker_first_event_id() -> str:
    """An event id whose pool seed puts the worker on the pool's first member (acct-a)."""
    for n in itertools.count():
        event_id = f"evt-{time.time_ns()}-{n}"
        if stable_index(generic_pool_seed("ci", "build.failed", event_id), 2) == 0:
            return event_id
    raise AssertionError("unreachable")


def _open_after_the_move(stand_in: ProviderStandIn) -> threading.Thread:
    """acct-a answers again once acct-b took a model call (the worker's move): its 429s
    are over by then, and the verifier, waiting for acct-a's cooldown, finds it open."""

    def watch() -> None:
        wait_for(lambda: stand_in.model_calls(KEY_B), what="a model call on acct-b")
        stand_in.modes[KEY_A] = "ok"

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("provider", clis.through_the_ledger(*clis.REAL_CLIS))
def test_a_429_account_cools_until_its_reset_and_the_step_moves_and_succeeds(
    provider: str,
    binaries: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    settings: Any,
) -> None:
    # Every 429 moves here: the pause of a per-minute limit (a reset this short) stays
    # on the account instead (tests/ledger/test_per_minute_limit.py).
    settings.LOOPSWEB_THROTTLE_SECONDS = 0
    stand_in.modes[KEY_A] = "429"
    # codex cools for the backoff (60 s: it prints no reset); claude waits Retry-After once
    # before it gives up, so its reset is also this test's wait.
    stand_in.retry_after = {"codex": 2, "claude": 15, "opencode": 20}[provider]
    clis.register_account(provider, "acct-a", stand_in, tmp_path, key=KEY_A)
    clis.register_account(provider, "acct-b", stand_in, tmp_path, key=KEY_B)
    project = git_project(tmp_path / "project")
    run = route_run(
        project, provider, _worker_first_event_id(), auth_profile_pool="acct-a,acct-b"
    )
    # The worker on acct-a meets the limit and moves to acct-b, the verifier's account.
    assert steps_of(run)["worker"].account_profile == "acct-a"
    assert steps_of(run)["verifier"].account_profile == "acct-b"
    opener = _open_after_the_move(stand_in)
    started = timezone.now()

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED, WorkflowRun.objects.get(
        pk=run.id
    ).error
    opener.join(timeout=5)
    moves = [
        (
            e.step_id,
            e.payload_json["from"],
            e.payload_json["to"],
            e.payload_json["code"],
        )
        for e in WorkflowEvent.objects.filter(
            workflow_run=run, event_type="step_account_moved"
        ).order_by("sequence")
    ]
    # Worker ≠ verifier: the verifier waited for acct-a rather than run on acct-b.
    assert moves == [
        ("worker", "acct-a", "acct-b", "rate_limit"),
        ("verifier", "acct-b", "acct-a", "role_conflict"),
    ], moves
    steps = steps_of(run)
    assert (steps["worker"].account_profile, steps["verifier"].account_profile) == (
        "acct-b",
        "acct-a",
    )
    waits = [
        (e.payload_json["code"], e.payload_json["reason"])
        for e in WorkflowEvent.objects.filter(
            workflow_run=run, event_type="step_waiting", step_id="verifier"
        )
    ]
    assert waits and all(code == "pool_rate_limited" for code, _ in waits), waits
    assert waits[0][1].endswith("(worker ≠ verifier)"), waits
    assert stand_in.model_calls(KEY_B)
    cooldown = AccountCooldown.objects.get(account_profile="acct-a")
    assert cooldown.until > started
    # The verifier started on acct-a once its cooldown was over, not before.
    verifier_start = WorkflowEvent.objects.get(
        workflow_run=run, event_type="step_started", step_id="verifier"
    )
    assert verifier_start.created_at >= cooldown.until
    if provider != "codex":  # codex prints no reset for an API rate limit: the backoff
        # The provider's reset ("try again in N s", Retry-After), counted from when the
        # runner read it (claude: when it gave up).
        reset = timedelta(seconds=stand_in.retry_after)
        assert started + reset - timedelta(seconds=5) <= cooldown.until, cooldown.until
        assert cooldown.until <= verifier_start.created_at, cooldown.until
    assert "429" in (cooldown.reason or "") or "rate" in (cooldown.reason or "").lower()
    page = _staff_page("/ops/accounts/")
    assert KEY_A not in page and KEY_B not in page
    _every_attempt_is_visible(run, "worker", page)


def _every_attempt_is_visible(run: WorkflowRun, moved: str, accounts: str) -> None:
    """Issue 39: the moved step has two attempts, acct-a rate limited then acct-b
    succeeded, and the item page, the run page, the API, `routes show` and
    /ops/accounts/ all show the rate-limited one."""
    attempts = list(
        WorkflowStepAttempt.objects.filter(workflow_run=run, step_id=moved).order_by(
            "started_at"
        )
    )
    assert [(a.account_profile, a.status) for a in attempts] == [
        ("acct-a", "rate_limited"),
        ("acct-b", "succeeded"),
    ], attempts
    assert all(a.finished_at and a.duration_ms is not None for a in attempts)
    assert "429" in (attempts[0].error or "") or "rate" in (attempts[0].error or "")
    story = f"{moved}: acct-a → rate limited after "
    item_page = _staff_page(f"/ops/items/{run.work_item_id}/")
    runs = item_page.split('id="runs"')[1].split("</section>")[0]
    assert story in runs and "→ acct-b, succeeded in " in runs, runs
    assert story in _staff_page(f"/admin/ledger/workflowrun/{run.id}/change/")
    _, token = make_token("read")
    body = (
        Client().get(f"/api/v1/work-items/{run.work_item_id}", **bearer(token)).json()
    )
    (step,) = [s for s in body["runs"][-1]["steps"] if s["stepId"] == moved]
    assert [(a["accountProfile"], a["status"]) for a in step["attempts"]] == [
        ("acct-a", "rate_limited"),
        ("acct-b", "succeeded"),
    ]
    assert step["attemptsText"].startswith(story)
    out = io.StringIO()
    call_command("routes", "show", run.work_item_id, stdout=out)
    assert story in out.getvalue(), out.getvalue()
    # /ops/accounts/: acct-a's attempt counts there (a step, a failure, a rate limit; the
    # verifier's step there too: two in all).
    row = accounts.split("<code>acct-a</code>")[1].split("</tr>")[0]
    cells = [c.split("</td>")[0] for c in row.split('<td class="num')[1:]]
    counts = [c.split(">")[-1].strip() for c in cells][-4:]
    assert counts == ["2", "2", "1", "1"], counts


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_hang_fails_at_the_idle_timeout_naming_it_with_the_output_seen(
    provider: str,
    binaries: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    settings: Any,
) -> None:
    stand_in.mode = "hang"
    settings.LOOPSWEB_KILL_GRACE_SECONDS = 1
    clis.register_account(provider, "acct-a", stand_in, tmp_path, key=KEY_A)
    project = git_project(tmp_path / "project")
    # The route's idle timeout (rendered into the steps as idleTimeoutMs): long enough that
    # codex and claude print their start first on the busy CI machine (both suites side by
    # side), as they do within a second on a quiet one.
    idle = round(hang_deadline(20))
    run = route_run(project, provider, auth_profile="acct-a", step_idle_timeout=idle)

    assert run_workflow_run(run.id) == RunStatus.TIMED_OUT
    worker = steps_of(run)["worker"]
    assert worker.status == StepStatus.TIMED_OUT
    # The same words for every CLI, and what it did last: codex started its turn; claude
    # (its init) and opencode (nothing) made no progress at all.
    assert worker.error.startswith(f"no progress for {idle:.1f} s (idle limit); "), (
        worker.error
    )
    if provider == "codex":
        assert worker.error.endswith("; last progress: turn.started event"), (
            worker.error
        )
    else:
        assert worker.error.endswith("; no progress since the step started"), (
            worker.error
        )
    if provider != "opencode":
        # codex and claude print their start (thread, init) before the request hangs; opencode
        # prints nothing at all until its model call ends.
        assert (worker.stdout or "") + (worker.stderr or ""), "the output seen so far"
    run.refresh_from_db()
    assert "(idle limit)" in run.error
    assert run.commit_diffstat == ""  # the run changed nothing, and says so
    page = _staff_page(f"/admin/ledger/workflowrun/{run.id}/change/")
    assert "no changes: the run left the project as it was" in page


@pytest.mark.parametrize(
    ("provider", "message"),
    clis.on_each_cli(
        ("codex", "Incorrect API key provided"),
        ("opencode", "Incorrect API key provided"),
        ("claude", "Not logged in"),
    ),
)
def test_a_login_failure_fails_the_step_with_the_clis_own_message(
    provider: str,
    message: str,
    binaries: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
) -> None:
    if provider == "claude":  # no login at all
        clis.register_account(provider, "acct-a", stand_in, tmp_path, key=None)
    else:
        stand_in.mode = "401"
        clis.register_account(provider, "acct-a", stand_in, tmp_path, key=KEY_A)
    project = git_project(tmp_path / "project")
    run = route_run(project, provider, auth_profile="acct-a")

    assert run_workflow_run(run.id) == RunStatus.FAILED
    worker = steps_of(run)["worker"]
    # The CLI gave up by itself (no retry loop on a refused key, no limit of ours reached),
    # with its own message and its exit code.
    assert worker.status == StepStatus.FAILED, worker.error  # a limit gives TIMED_OUT
    assert message.lower() in worker.error.lower(), worker.error
    assert worker.error.endswith(f"(exit code {worker.exit_code})")
    assert worker.exit_code not in (0, None)
    if provider == "claude":  # with no login it asks nothing of the provider
        assert not [r for r in stand_in.requests if r.method == "POST"]
    run.refresh_from_db()
    assert worker.error in run.error
    # The CLI's words read as a refused login: the account is marked, with those words.
    account = Account.objects.get(pk="acct-a")
    assert (
        account.login_failed_at is not None
        and account.login_failed_reason == worker.error
    )
    item_page = _staff_page(
        f"/admin/ledger/workflowworkitem/{run.work_item_id}/change/"
    )
    assert "step-error" in item_page and message.lower() in item_page.lower()
    assert KEY_A not in item_page


@pytest.mark.parametrize("provider", clis.through_the_ledger(*clis.REAL_CLIS))
@pytest.mark.django_db(transaction=True)
def test_a_slow_answer_is_in_the_step_run_while_the_step_still_runs(
    provider: str,
    binaries: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
) -> None:
    stand_in.mode = "slow"
    # Each CLI prints its tool call's events before the final message streams, and the
    # runner flushes every second: the stored output shows while the answer streams, which
    # it does until the test has seen it (`slow_hold`), however busy the machine.
    stand_in.slow_seconds = 6
    stand_in.slow_hold = threading.Event()
    clis.register_account(provider, "acct-a", stand_in, tmp_path, key=KEY_A)
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

        def output_while_running() -> WorkflowStepRun | None:
            assert proc.poll() is None, "the runner ended before any output was seen"
            worker = WorkflowStepRun.objects.get(workflow_run=run, step_id="worker")
            running = worker.status == StepStatus.RUNNING
            return worker if running and (worker.stdout or worker.stderr) else None

        wait_for(
            output_while_running,
            timeout=120,
            interval=0.5,
            what="output to reach the step run while it runs",
        )
        page = _staff_page("/ops/")
        assert "live-output" in page
        stand_in.slow_hold.set()
        proc.wait(timeout=120)
    finally:
        stand_in.slow_hold.set()
        kill_group_quietly(proc.pid)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error


def test_the_key_is_nowhere_in_the_database_the_pages_the_api_or_the_logs(
    binaries: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import io
    import json
    import logging

    from django.apps import apps
    from django.core.management import call_command

    from routing.api.tokens import api_token_create

    caplog.set_level(logging.DEBUG)
    clis.register_account("codex", "acct-a", stand_in, tmp_path, key=KEY_A)
    project = git_project(tmp_path / "project")
    run = route_run(project, "codex", auth_profile="acct-a")
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert stand_in.keys_seen() == {KEY_A}  # the key did reach the provider
    out = io.StringIO()
    call_command("account", "list", "--json", stdout=out)
    texts = {"account list": out.getvalue(), "logs": caplog.text}
    for app in ("ledger", "routing"):
        for model in apps.get_app_config(app).get_models():
            rows = list(model.objects.values())
            texts[model.__name__] = json.dumps(rows, default=str)
    for path in (
        "/ops/",
        "/ops/accounts/",
        f"/ops/items/{run.work_item_id}/",
        "/admin/ledger/account/",
        "/admin/ledger/account/acct-a/change/",
        f"/admin/ledger/workflowrun/{run.id}/change/",
        f"/admin/ledger/workflowworkitem/{run.work_item_id}/change/",
    ):
        texts[path] = _staff_page(path)
    _, token = api_token_create(name="reader", scopes=["read"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    for path in ("/api/v1/accounts", f"/api/v1/work-items/{run.work_item_id}"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.content[:300])
        texts[path] = response.content.decode()
    leaked = [where for where, text in texts.items() if KEY_A in text]
    assert leaked == []
