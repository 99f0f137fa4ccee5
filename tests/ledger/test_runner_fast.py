"""The runner's decisions in this process, with no agent process at all: each step's
process is the scripted fake of tests/ledger/fake_process.py (patched as
`runs.agent_step.run_process`), and the project is no git work tree, so a run makes no
worktree and starts no git. Each test proves a decision a slow test proves with the fake
agent script (named in its docstring), on the same ledger rows and events; these run in
`make test-fast`.

A wait for an account is tested as the django-q2 task takes it (`hand_back`: the run is
parked and its task handed back, no sleep), and once inline with the sleep of
runs.step_start replaced (the slot frees during it)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from domain import reasons
from ledger import reaper, services
from ledger.claims import COOLDOWN, PARKED_REASONS, TASK_PARKED
from ledger.models import (
    Account,
    AccountCooldown,
    AccountWindow,
    LoopStatus,
    RunStatus,
    SpecStatus,
    StepReasonCode,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.selectors import account_load
from ledger.services.account_loads import account_load_drift
from ledger.services.failover import ACCOUNT_PAUSED_CODE
from ledger.services.retries import TRY_LATER_EXIT_CODE
from routing.admission import CREATED
from runs import step_start
from runs.runner import (
    HANDED_BACK,
    LOST,
    NO_ACCOUNT_LEFT,
    NOT_DUE,
    PAUSES_IN_A_ROW,
    run_workflow_run,
)
from tests.ledger.account_failover_helpers import attempts_of, pooled_run
from tests.ledger.fake_process import (
    CODEX_USAGE,
    Call,
    FakeProcess,
    Outcome,
    fails,
    hangs,
    install_fake_process,
    login_refused,
    rate_limited,
    try_later,
)
from tests.ledger.runner_helpers import (
    account_moves,
    admit_workflow,
    agent_step,
    event_types,
    register_accounts,
    route_created,
    route_generic,
    steps_of,
)

pytestmark = pytest.mark.django_db

POOL = ["acctA", "acctB"]
TRY_LATER_ERROR = "step worker: the agent asked to try later (exit 75)"


@pytest.fixture
def fake(settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeProcess:
    return install_fake_process(settings, monkeypatch, tmp_path)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory inside the project roots that is no git work tree."""
    path = tmp_path / "project"
    path.mkdir()
    return path


def _payloads(run: WorkflowRun, event_type: str) -> list[dict[str, Any]]:
    return [
        e.payload_json or {}
        for e in WorkflowEvent.objects.filter(
            workflow_run=run, event_type=event_type
        ).order_by("sequence")
    ]


class _HandBacks:
    """The django-q2 task's `hand_back`: the delays the run's task was handed back with."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, _run_id: str, delay: float) -> None:
        self.delays.append(delay)


# --- a run that succeeds ------------------------------------------------------------------------


def test_a_routed_run_runs_worker_then_verifier_on_two_accounts(
    fake: FakeProcess, project: Path
) -> None:
    """tests/ledger/test_runner.py::test_an_admitted_route_runs_worker_then_verifier_on_their_accounts_and_cascades,
    with codex's own output: its usage is recorded, its events are progress. The accounts
    are registered, so the pool is loopsweb's pool routing (an unregistered codex pool is
    assigned as upstream assigns it)."""
    for name in POOL:
        services.account_add(name=name, provider="codex")
    result = route_generic(project, auth_profile_pool=POOL, provider="codex")
    assert result.kind == CREATED and result.run is not None
    run = result.run

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.error is None
    assert run.lease_expires_at is None and run.claimed_by == services.worker_identity()
    steps = steps_of(run)
    # Worker first, the verifier after it, each on the account the ledger records.
    assert [(c.step, c.account) for c in fake.calls] == [
        ("worker", steps["worker"].account_profile),
        ("verifier", steps["verifier"].account_profile),
    ]
    # Worker ≠ verifier: the pool put the two roles on its two accounts.
    assert {s.account_profile for s in steps.values()} == set(POOL)
    assert run.invocation.scope_json["providerRouting"]["poolRouting"] is True
    for call in fake.calls:
        step = steps[str(call.step)]
        assert call.run_id == run.id and call.cwd == str(project)
        assert call.provider == "codex" and call.argv[1:3] == ["exec", "--json"]
        assert step.status == StepStatus.SUCCEEDED and step.exit_code == 0
        assert step.account_tool == "codex" and step.error is None
        # The pid the fake reported is recorded, and is no process at all.
        assert step.pid == call.pid
        with pytest.raises(ProcessLookupError):
            os.getpgid(call.pid)
        assert (
            step.usage_input_tokens,
            step.usage_cached_tokens,
            step.usage_output_tokens,
        ) == (
            CODEX_USAGE["input_tokens"],
            CODEX_USAGE["cached_input_tokens"],
            CODEX_USAGE["output_tokens"],
        )
        # Its JSON events were progress, written with the flush while it ran.
        assert step.progress_at is not None
        assert '"type":"turn.completed"' in (step.stdout or "")
    assert steps["verifier"].started_at >= steps["worker"].finished_at
    assert attempts_of(run) == [
        (steps["worker"].account_profile, "succeeded"),
        (steps["verifier"].account_profile, "succeeded"),
    ]
    assert [(t, s) for _, t, s in event_types(run)] == [
        ("created", None),
        ("claimed", None),
        ("step_started", "worker"),
        ("step_succeeded", "worker"),
        ("step_started", "verifier"),
        ("step_succeeded", "verifier"),
        ("succeeded", None),
        ("workflow_archived", None),
    ]
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert item.status == WorkItemStatus.SUCCEEDED and item.lease_expires_at is None
    assert run.loop is not None
    run.loop.refresh_from_db()
    assert run.loop.status == LoopStatus.STOPPED
    run.workflow.refresh_from_db()
    assert run.workflow.status == SpecStatus.ARCHIVED
    assert account_load().total() == {}


# --- an account's failure moves the step ------------------------------------------------------


def test_a_429_moves_the_step_to_a_free_member_and_the_run_succeeds(
    fake: FakeProcess, project: Path
) -> None:
    """tests/ledger/test_failover.py::test_a_rate_limited_step_succeeds_on_the_second_account
    and tests/ledger/test_runner.py::test_a_rate_limited_step_cools_its_account_until_the_named_time."""
    pool = {"acctA", "acctB", "acctC"}
    run = route_generic(
        project, "evt-fast-0", auth_profile_pool="acctA,acctB,acctC", created=True
    ).run
    first = steps_of(run)["worker"].account_profile
    verifier = steps_of(run)["verifier"].account_profile
    assert first is not None and verifier is not None
    other = (pool - {first, verifier}).pop()
    fake.script(rate_limited(120), account=first)
    before = timezone.now()

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    after = timezone.now()
    assert fake.accounts("worker") == [first, other]
    assert steps_of(run)["worker"].account_profile == other
    assert account_moves(run) == [(first, other, "rate_limit")]
    assert attempts_of(run) == [
        (first, "rate_limited"),
        (other, "succeeded"),
        (verifier, "succeeded"),
    ]
    limited = WorkflowStepAttempt.objects.get(workflow_run=run, account_profile=first)
    assert limited.error == (
        "HTTP 429 Too Many Requests. Retry-After: 120 (exit code 1); provider rate "
        "limit: HTTP 429 Too Many Requests. Retry-After: 120"
    )
    cooldown = AccountCooldown.objects.get(pk=first)
    assert before + timedelta(seconds=120) <= cooldown.until
    assert cooldown.until <= after + timedelta(seconds=120)
    assert cooldown.reports == 1 and cooldown.account_tool == "codewith"
    assert "HTTP 429 Too Many Requests" in cooldown.reason and run.id in cooldown.reason
    assert set(AccountCooldown.objects.values_list("pk", flat=True)) == {first}
    assert account_load_drift() == []


def test_a_401_moves_the_step_and_marks_the_account_login_failed(
    fake: FakeProcess, project: Path
) -> None:
    """tests/ledger/test_account_failover.py::test_a_refused_login_moves_the_step_to_the_pools_other_account
    and tests/ledger/test_login_failed.py::test_a_refused_login_marks_the_account_and_no_later_step_is_assigned_to_it."""
    register_accounts(*POOL)
    fake.script(login_refused(), account="acctA")
    run = pooled_run(project, POOL)

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    assert fake.accounts() == ["acctA", "acctB"]
    assert steps_of(run)["worker"].account_profile == "acctB"
    assert attempts_of(run) == [("acctA", "login_failed"), ("acctB", "succeeded")]
    assert account_moves(run) == [("acctA", "acctB", reasons.LOGIN_FAILED)]
    failed = WorkflowStepAttempt.objects.get(workflow_run=run, account_profile="acctA")
    account = Account.objects.get(pk="acctA")
    assert account.login_failed_at is not None
    assert account.login_failed_at >= failed.started_at
    assert account.login_failed_reason == (
        "unexpected status 401 Unauthorized (exit code 1)"
    )
    assert failed.error == account.login_failed_reason
    assert Account.objects.get(pk="acctB").login_failed_at is None
    assert not AccountCooldown.objects.exists()


def test_a_hang_moves_the_step_and_marks_the_account_unresponsive(
    fake: FakeProcess, project: Path, settings: Any
) -> None:
    """tests/ledger/test_account_failover.py::test_a_hang_moves_the_step_and_marks_the_account_unresponsive."""
    settings.LOOPSWEB_UNRESPONSIVE_SECONDS = 900
    register_accounts(*POOL)
    fake.script(hangs(), account="acctA")
    run = pooled_run(project, POOL, idle_ms=1000)
    before = timezone.now()

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    assert fake.accounts() == ["acctA", "acctB"]
    assert fake.calls[0].limits.idle_timeout_seconds == 1.0
    assert steps_of(run)["worker"].account_profile == "acctB"
    assert attempts_of(run) == [("acctA", "unresponsive"), ("acctB", "succeeded")]
    assert account_moves(run) == [("acctA", "acctB", reasons.UNRESPONSIVE)]
    hung = WorkflowStepAttempt.objects.get(workflow_run=run, account_profile="acctA")
    assert (hung.error or "").startswith("no progress for 1.0 s (idle limit)")
    account = Account.objects.get(pk="acctA")
    span = timedelta(seconds=900)
    assert account.unresponsive_until is not None
    assert before + span <= account.unresponsive_until <= timezone.now() + span
    assert "(idle limit)" in (account.unresponsive_reason or "")
    assert Account.objects.get(pk="acctB").unresponsive_until is None
    assert account.login_failed_at is None and not AccountCooldown.objects.exists()


def test_no_account_left_fails_the_run_with_the_reason(
    fake: FakeProcess, project: Path
) -> None:
    """tests/ledger/test_account_failover.py::test_no_account_left_fails_the_run_with_the_reason."""
    register_accounts(*POOL)
    fake.script(hangs(), account="acctA")
    fake.script(login_refused(), account="acctB")
    run = pooled_run(project, POOL, idle_ms=1000)

    assert run_workflow_run(run.id) == RunStatus.FAILED

    assert fake.accounts() == ["acctA", "acctB"]
    assert attempts_of(run) == [("acctA", "unresponsive"), ("acctB", "login_failed")]
    assert account_moves(run) == [("acctA", "acctB", reasons.UNRESPONSIVE)]
    run.refresh_from_db()
    assert run.error == (
        "step worker failed: unexpected status 401 Unauthorized (exit code 1)"
        + NO_ACCOUNT_LEFT
    )
    worker = steps_of(run)["worker"]
    assert worker.reason_code == StepReasonCode.LOGIN_FAILED
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert item.status == WorkItemStatus.FAILED and item.last_reason == run.error


# --- a whole pool rate limited ----------------------------------------------------------------


def test_a_whole_pool_rate_limited_holds_the_task_then_runs_it_again(
    fake: FakeProcess, project: Path, settings: Any
) -> None:
    """tests/ledger/test_failover.py::test_every_account_rate_limited_holds_the_task_at_its_second_account,
    then the hold (ledger.claims rule 1) as the next deliveries of the run's task meet it."""
    settings.LOOPSWEB_RATE_LIMIT_MOVES = 2
    pool = ["acctA", "acctB", "acctC", "acctD"]
    fake.script(rate_limited(None), times=2)  # "usage limit reached", no reset named
    run = route_generic(
        project, "evt-fast-0", auth_profile_pool=",".join(pool), created=True
    ).run
    hand_back = _HandBacks()

    assert run_workflow_run(run.id, hand_back=hand_back) == HANDED_BACK

    # The first account is cooled and the step moves; the second one's report is the
    # task's second: not marked, the task held there before the move bound is reached.
    first, second = fake.accounts("worker")
    assert first != second and account_moves(run) == [(first, second, "rate_limit")]
    assert attempts_of(run) == [(first, "rate_limited"), (second, "rate_limited")]
    assert set(AccountCooldown.objects.values_list("pk", flat=True)) == {first}
    (parked,) = _payloads(run, "task_parked")
    assert (parked["kind"], parked["account"], parked["marked"]) == (
        COOLDOWN,
        second,
        first,
    )
    hold_end = AccountCooldown.objects.get(pk=first).until  # the pool's first reset
    assert parked["until"] == hold_end.isoformat()
    waiting = _payloads(run, "step_waiting")
    assert [w["code"] for w in waiting] == [TASK_PARKED]
    assert waiting[0]["reason"].startswith(PARKED_REASONS[COOLDOWN])
    worker = steps_of(run)["worker"]
    assert worker.status == StepStatus.FAILED and worker.account_profile == second
    assert (worker.error or "").startswith(PARKED_REASONS[COOLDOWN])
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.claimed_by is None
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert (item.last_reason or "").startswith(PARKED_REASONS[COOLDOWN])
    # Handed back for the next look (the poll interval, the hold being longer).
    assert hand_back.delays == [0.05]

    # Delivered again while the hold lasts: the step does not start, nothing runs.
    assert run_workflow_run(run.id, hand_back=hand_back) == HANDED_BACK
    assert len(fake.calls) == 2 and len(hand_back.delays) == 2

    # Once the hold has ended, the step runs again on the account it was held at.
    with time_machine.travel(hold_end + timedelta(seconds=1), tick=True):
        assert run_workflow_run(run.id, hand_back=hand_back) == RunStatus.SUCCEEDED
    assert fake.accounts("worker") == [first, second, second]
    assert len(account_moves(run)) == 1
    assert attempts_of(run)[:3] == [
        (first, "rate_limited"),
        (second, "rate_limited"),
        (second, "succeeded"),
    ]


def test_a_per_minute_429_pauses_on_its_account_then_moves_after_three_pauses(
    fake: FakeProcess, project: Path
) -> None:
    """tests/ledger/test_per_minute_limit.py::test_after_three_pauses_across_hand_backs_the_step_moves
    (failover rule 7; LOOPSWEB_THROTTLE_SECONDS 20: a 2 s reset pauses)."""
    fake.script(rate_limited(2), account="acctA")
    run = pooled_run(project, POOL)
    hand_back = _HandBacks()

    outcomes = []
    for _ in range(PAUSES_IN_A_ROW + 1):
        outcomes.append(run_workflow_run(run.id, hand_back=hand_back))
        if outcomes[-1] != HANDED_BACK:
            break
        if len(outcomes) == 1:
            # The first pause: on the same account, no move, the run parked.
            assert attempts_of(run) == [("acctA", "rate_limited")]
            assert not account_moves(run)
            run.refresh_from_db()
            assert run.status == RunStatus.RUNNING and run.claimed_by is None
        # The reset has passed (the time a pause lasts): the run resumes.
        now = timezone.now()
        AccountCooldown.objects.filter(pk="acctA").update(until=now)
        AccountWindow.objects.filter(account_profile="acctA").update(resets_at=now)

    assert outcomes == [HANDED_BACK] * 3 + [RunStatus.SUCCEEDED], outcomes
    assert fake.accounts() == ["acctA"] * 4 + ["acctB"]
    assert attempts_of(run) == [("acctA", "rate_limited")] * 4 + [
        ("acctB", "succeeded")
    ]
    assert account_moves(run) == [("acctA", "acctB", "rate_limit")]
    paused = [
        w for w in _payloads(run, "step_waiting") if w["code"] == ACCOUNT_PAUSED_CODE
    ]
    assert len(paused) == 3
    assert "acctA answered a per-minute rate limit" in paused[0]["reason"]
    # Each hand-back lasts the pause and at most a quarter more (the stagger).
    assert len(hand_back.delays) == 3
    assert all(1.5 < delay <= 2.5 for delay in hand_back.delays), hand_back.delays


# --- exit 75 ----------------------------------------------------------------------------------


def test_exit_75_runs_the_item_again_later_and_refunds_the_attempt(
    fake: FakeProcess, project: Path
) -> None:
    """tests/ledger/test_try_later.py::test_exit_75_runs_again_later_and_the_attempt_is_refunded
    (its /ops/ page check left out: the page is not the runner's, and costs a second)."""
    fake.script(try_later(), step="worker", times=1)
    result = route_created(project, auth_profile="acctA", retry_backoff="5m")
    assert result.loop.max_attempts == 1
    item_id = result.work_item.id
    before = timezone.now()

    assert run_workflow_run(result.run.id) == RunStatus.FAILED

    first, second = WorkflowRun.objects.filter(work_item_id=item_id).order_by("id")
    assert first.error == TRY_LATER_ERROR
    assert steps_of(first)["worker"].exit_code == TRY_LATER_EXIT_CODE
    assert steps_of(first)["verifier"].status == StepStatus.SKIPPED
    item = WorkflowWorkItem.objects.get(pk=item_id)
    assert item.status == WorkItemStatus.ADMITTED and item.attempts == 1
    assert item.workflow_run_id == second.id and second.status == RunStatus.QUEUED
    assert item.last_reason == (
        "the agent asked to try later (exit 75): step worker runs again in 300 s"
    )
    assert second.scheduled_for is not None
    assert second.scheduled_for >= before + timedelta(seconds=300)
    assert run_workflow_run(second.id) == NOT_DUE
    event = first.events.get(event_type="step_try_later")
    assert event.step_id == "worker" and event.payload_json is not None
    assert event.payload_json["exitCode"] == 75
    assert event.payload_json["retryRunId"] == second.id
    assert event.payload_json["redispatch"] == 1
    created = second.events.get(event_type="created").payload_json
    assert created is not None and created["tryLater"] is True
    assert created["attempt"] == 1
    assert not AccountCooldown.objects.exists()

    # Its backoff over, the second run works.
    WorkflowRun.objects.filter(pk=second.id).update(scheduled_for=None)
    assert run_workflow_run(second.id) == RunStatus.SUCCEEDED
    item.refresh_from_db()
    assert item.status == WorkItemStatus.SUCCEEDED and item.attempts == 1
    assert [c.step for c in fake.calls] == ["worker", "worker", "verifier"]
    assert [c.outcome for c in fake.calls] == ["try_later", "succeeds", "succeeds"]


# --- a failing verifier -----------------------------------------------------------------------


def test_a_failing_verifier_fails_the_run_with_the_runners_message(
    fake: FakeProcess, project: Path
) -> None:
    """tests/ledger/test_runner.py::test_a_failing_step_fails_the_run_skips_the_rest_and_fails_the_item,
    for the last step: the run's error is the runner's `step <id> <status>: <error>`."""
    fake.script(fails(1, "pytest: 2 tests still fail"), step="verifier")
    run = route_generic(project, auth_profile="acctA", created=True).run

    assert run_workflow_run(run.id) == RunStatus.FAILED

    run.refresh_from_db()
    steps = steps_of(run)
    assert steps["worker"].status == StepStatus.SUCCEEDED
    verifier = steps["verifier"]
    assert verifier.status == StepStatus.FAILED and verifier.exit_code == 1
    assert verifier.error == "pytest: 2 tests still fail (exit code 1)"
    assert verifier.reason_code == StepReasonCode.FAILED
    assert run.error == "step verifier failed: pytest: 2 tests still fail (exit code 1)"
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert item.status == WorkItemStatus.FAILED and item.last_reason == run.error
    assert [(t, s) for _, t, s in event_types(run)][-5:] == [
        ("step_succeeded", "worker"),
        ("step_started", "verifier"),
        ("step_failed", "verifier"),
        ("failed", None),
        ("workflow_archived", None),
    ]
    assert attempts_of(run) == [("acctA", "succeeded"), ("acctA", "failed")]
    # An ordinary failure is no account's: nothing cooled, marked or moved.
    assert not AccountCooldown.objects.exists() and account_moves(run) == []
    assert [c.step for c in fake.calls] == ["worker", "verifier"]


# --- a step start refused ---------------------------------------------------------------------


def _busy_account(project: Path, profile: str = "acctA") -> WorkflowStepRun:
    """A step of another run running on `profile` (another worker's)."""
    busy = admit_workflow([agent_step("worker", cwd=project, profile=profile)])
    assert services.run_claim(run_id=busy.id, worker="other-host:1") is not None
    step = steps_of(busy)["worker"]
    assert services.step_start(step_run_id=step.id, worker="other-host:1").started
    return step


def test_a_step_start_refused_at_the_account_cap_hands_the_run_back_until_a_slot_frees(
    fake: FakeProcess, project: Path
) -> None:
    """tests/ledger/test_runner.py::test_a_step_does_not_start_while_its_account_is_at_its_cap_and_says_why_once
    and tests/ledger/test_runner_process.py::test_a_worker_at_the_account_cap_waits_and_starts_when_a_slot_frees,
    as the django-q2 task waits: parked, handed back."""
    busy = _busy_account(project)
    run = admit_workflow(
        [agent_step("worker", cwd=project, profile="acctA", max_per_profile=1)]
    )
    hand_back = _HandBacks()

    for _ in range(2):
        assert run_workflow_run(run.id, hand_back=hand_back) == HANDED_BACK
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and run.claimed_by is None
        assert steps_of(run)["worker"].status == StepStatus.PENDING

    assert fake.calls == []
    assert hand_back.delays == [0.05, 0.05]  # the poll interval: no end is known
    # Says why once, however often it is refused.
    assert _payloads(run, "step_waiting") == [
        {
            "code": "profile_cap",
            "reason": "account acctA is at capacity (1/1 running steps)",
        }
    ]

    services.step_finish(step_run_id=busy.id, status=StepStatus.SUCCEEDED, exit_code=0)
    assert run_workflow_run(run.id, hand_back=hand_back) == RunStatus.SUCCEEDED
    assert [(c.step, c.account) for c in fake.calls] == [("worker", "acctA")]
    assert len(hand_back.delays) == 2
    assert account_load_drift() == []


def test_inline_a_refused_start_sleeps_the_poll_interval_and_starts_once_free(
    fake: FakeProcess, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/ledger/test_runner.py::test_the_runner_waits_for_a_cooling_account_then_runs
    (`manage.py run_workflow`: no hand-back), its sleep replaced: the cooldown ends during
    the second."""
    until = timezone.now() + timedelta(minutes=5)
    AccountCooldown.objects.create(account_profile="acctA", until=until, reason="429")
    run = admit_workflow([agent_step("worker", cwd=project, profile="acctA")])
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            AccountCooldown.objects.filter(pk="acctA").update(until=timezone.now())

    monkeypatch.setattr(
        step_start, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep)
    )

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    assert slept == [0.05, 0.05]  # the poll interval, below a renewal interval
    assert fake.accounts() == ["acctA"]
    (waiting,) = _payloads(run, "step_waiting")
    assert waiting["code"] == "cooldown"
    assert waiting["reason"].startswith("account acctA is cooling down until ")
    assert steps_of(run)["worker"].status == StepStatus.SUCCEEDED


# --- the lease lost while a step runs ---------------------------------------------------------


def test_a_run_cancelled_while_its_step_runs_is_left_to_the_cancel(
    fake: FakeProcess, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/ledger/test_runner_process.py::test_cancelling_a_running_run_stops_its_worker_and_the_agent:
    the next lease renewal fails, the step's output is kept, nothing more is written; the
    cancel's kill path reaches the step's pid and signals nothing (no such process)."""
    signalled: list[tuple[int | None, bool]] = []
    kill = reaper.kill_step_process_group

    def spy(step: WorkflowStepRun, **kwargs: Any) -> bool:
        killed = kill(step, **kwargs)
        signalled.append((step.pid, killed))
        return killed

    monkeypatch.setattr(reaper, "kill_step_process_group", spy)

    def cancel(call: Call) -> None:
        assert call.run_id is not None
        services.run_cancel(run_id=call.run_id, reason="operator stop")

    # Long enough for a lease renewal (a third of the 30 s lease).
    fake.script(
        Outcome(
            "cancelled",
            stdout="fake-process: working\n",
            duration_ms=15_000,
            during=cancel,
        )
    )
    run = admit_workflow([agent_step("worker", cwd=project, profile="acctA")])

    assert run_workflow_run(run.id) == LOST

    (call,) = fake.calls
    # The renewal during the step found the run gone: the step was stopped as lost.
    (result,) = fake.results
    assert result.lost and result.exit_code is None
    assert signalled == [(call.pid, False)]
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.error == "operator stop"
    worker = steps_of(run)["worker"]
    assert worker.status == StepStatus.CANCELLED and worker.pid == call.pid
    # The tail is kept on cancel: what the agent printed before it was stopped.
    assert worker.stdout == "fake-process: working\n"
    assert not run.events.filter(event_type__in=["step_failed", "failed"]).exists()
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert item.status == WorkItemStatus.CANCELLED
    assert account_load().total() == {}
