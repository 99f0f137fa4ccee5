"""Bounded trust in what a step prints about its account (issue 58, ledger.claims): one task
marks at most one account of each kind, a second one parks the task; a claim longer than 15
minutes stands 15 minutes, "unconfirmed", until loopsweb's own request confirms it.

In-process, on the services. The runner's reaction and the confirmation with the fake agent
as the CLI: tests/ledger/test_claims_runner.py; the hostile stand-in through the run
cluster: tests/ledger/test_claims_process.py."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from domain.windows import REJECTED, Window
from ledger import services
from ledger.claims import (
    COOLDOWN,
    PARKED_EVENT,
    PARKED_REASONS,
    TASK_PARKED,
    UNCONFIRMED_LONGEST,
    WINDOW,
    Claim,
    task_hold,
)
from ledger.models import (
    Account,
    AccountCooldown,
    AccountWindow,
    RunStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
)
from ledger.services.cascade import task_parked
from ledger.windows import latest_windows, windows_claimed, windows_record
from routing.admission import retry_work_item
from tests.factories import make_run, make_step_run, make_work_item
from tests.ledger.account_failover_helpers import pooled_run
from tests.routing.helpers import generic_event, route

WEEK = timedelta(hours=168)
HOUR = timedelta(hours=1)


def _step(account: str, item: object | None = None) -> WorkflowStepRun:
    """A running step of a new run of `item` (a new task when None) on `account`."""
    run = make_run(work_item=item or make_work_item())
    return make_step_run(workflow_run=run, account_profile=account, step_id="worker")


def _report(step: WorkflowStepRun, until_in: timedelta = WEEK) -> services.Report:
    return services.account_cooldown_report(
        step_run=step,
        tool="codex",
        until=timezone.now() + until_in,
        reason="codex rate limit: 429 try again in 168 hours",
    )


@pytest.mark.django_db
def test_a_second_account_of_one_task_is_not_cooled_and_the_task_parks() -> None:
    item = make_work_item()
    first = _report(_step("acctA", item))
    assert first.taken and first.parked is None
    # The same task's retry (another run of the item) on acctB: not marked, parked.
    second_step = _step("acctB", item)
    second = _report(second_step)
    assert not second.taken and second.parked == PARKED_REASONS[COOLDOWN]
    assert "every account this task tried reported a rate limit" in second.parked
    assert "`account check`" in second.parked
    assert not AccountCooldown.objects.filter(pk="acctB").exists()
    assert "acctB" not in latest_windows(["acctB"])
    parked = WorkflowEvent.objects.get(
        workflow_run_id=second_step.workflow_run_id, event_type=PARKED_EVENT
    )
    assert parked.payload_json["code"] == TASK_PARKED
    assert parked.payload_json["marked"] == "acctA"
    # A rate limit holds the task (at most the 15 minutes a claim gets unconfirmed), it
    # does not end it for good as a failed login does; the item says why it waits.
    assert second.held and not task_parked(second_step.workflow_run_id)
    until = datetime.fromisoformat(parked.payload_json["until"])
    assert timezone.now() < until <= timezone.now() + UNCONFIRMED_LONGEST
    held = task_hold(second_step.workflow_run, timezone.now())
    assert held is not None and held[1] == until
    assert held[0].startswith(PARKED_REASONS[COOLDOWN])
    item.refresh_from_db()
    assert item.last_reason == held[0]
    # The account the task marked may report again (it is the one account).
    assert _report(_step("acctA", item)).taken
    # Another task may mark acctB.
    assert _report(_step("acctB")).taken
    assert AccountCooldown.objects.filter(pk="acctB").exists()


@pytest.mark.django_db
def test_a_second_login_failure_of_one_task_is_not_marked() -> None:
    for name in ("acctA", "acctB", "acctC"):
        services.account_add(name=name, provider="codex")
    item = make_work_item()
    first = services.account_login_failed_report(
        step_run=_step("acctA", item), reason="Not logged in"
    )
    second = services.account_login_failed_report(
        step_run=_step("acctB", item), reason="Not logged in"
    )
    assert first.taken and not second.taken
    assert second.parked is not None and "failed login" in second.parked
    assert not second.held
    marked = set(
        Account.objects.filter(login_failed_at__isnull=False).values_list(
            "name", flat=True
        )
    )
    assert marked == {"acctA"}
    # An unregistered account is marked nowhere and uses up nothing of the bound.
    other = make_work_item()
    gone = services.account_login_failed_report(
        step_run=_step("nobody", other), reason="Not logged in"
    )
    assert not gone.taken and gone.parked is None
    assert services.account_login_failed_report(
        step_run=_step("acctC", other), reason="Not logged in"
    ).taken


@pytest.mark.django_db
def test_a_cooldown_longer_than_15_minutes_stands_15_minutes_unconfirmed() -> None:
    before = timezone.now()
    report = _report(_step("acctA"))
    row = AccountCooldown.objects.get(pk="acctA")
    assert row.until <= timezone.now() + UNCONFIRMED_LONGEST
    assert row.until >= before + UNCONFIRMED_LONGEST
    assert row.reason is not None and row.reason.startswith("unconfirmed for 15 min")
    assert "try again in 168 hours" in row.reason
    assert report.claim is not None and report.claim.kind == COOLDOWN
    assert report.claim.until >= before + WEEK
    # Its window observation (the 429 as a rejected window) is cut the same way.
    (seen,) = latest_windows(["acctA"])["acctA"]
    assert seen.resets_at == row.until
    # A short one stands as claimed, with nothing to confirm.
    short = _report(_step("acctB"), until_in=timedelta(minutes=5))
    assert short.taken and short.claim is None
    plain = AccountCooldown.objects.get(pk="acctB")
    assert plain.reason is not None and "unconfirmed" not in plain.reason


@pytest.mark.django_db
def test_an_exhausted_window_is_bounded_per_task_and_cut_to_15_minutes() -> None:
    now = timezone.now()
    forged = Window(name="7d", used=1.0, status=REJECTED, resets_at=now + WEEK)
    fine = Window(name="5h", used=0.2, status="allowed", resets_at=now + WEEK)
    item = make_work_item()
    first = _step("acctA", item)
    written, claimed = windows_claimed(
        account="acctA", provider="claude", windows=[forged, fine], step_run_id=first.id
    )
    assert written == 2 and [w.name for w in claimed] == ["7d"]
    assert claimed[0].resets_at is not None and claimed[0].resets_at >= now + WEEK
    windows = {w.name: w for w in latest_windows(["acctA"])["acctA"]}
    assert windows["7d"].resets_at is not None
    assert windows["7d"].resets_at <= timezone.now() + UNCONFIRMED_LONGEST
    assert windows["7d"].source.startswith("unconfirmed")
    # The same task's second account: its exhausted window is not recorded, the rest is.
    second = _step("acctB", item)
    written, claimed = windows_claimed(
        account="acctB",
        provider="claude",
        windows=[forged, fine],
        step_run_id=second.id,
    )
    assert written == 1 and claimed == []
    assert set(
        AccountWindow.objects.filter(account_profile="acctB").values_list(
            "window", flat=True
        )
    ) == {"5h"}
    # Another task's step on acctB records it (cut to 15 minutes too).
    written, claimed = windows_claimed(
        account="acctB",
        provider="claude",
        windows=[forged],
        step_run_id=_step("acctB").id,
    )
    assert written == 1 and len(claimed) == 1


@pytest.mark.django_db
def test_a_held_task_tries_again_when_an_account_of_its_pool_is_free(
    tmp_path: Path,
) -> None:
    """The hold ends at the earliest end of a cooldown in the run's pool when that comes
    before the second account's own claim."""
    run = pooled_run(tmp_path, ["acctA", "acctB", "acctC"])
    (step,) = WorkflowStepRun.objects.filter(workflow_run=run)
    services.account_cooldown_record(
        profile="acctC",
        tool="codewith",
        until=timezone.now() + timedelta(minutes=2),
        reason="another task's 429",
    )
    assert _report(step, until_in=timedelta(minutes=10)).taken  # acctA: marked
    step.account_profile = "acctB"
    step.save(update_fields=["account_profile"])
    held = _report(step, until_in=timedelta(minutes=10))
    assert held.held
    hold = task_hold(run, timezone.now())
    assert hold is not None
    cooled = AccountCooldown.objects.get(pk="acctC").until
    assert hold[1] == cooled  # acctC's end, not acctB's claimed 10 minutes


@pytest.mark.django_db
def test_a_lower_reading_never_refills_a_window_held_exhausted() -> None:
    """A forged `USED:0` (or any lower reading a step prints) after an exhausted window
    leaves it exhausted until its reset; an operator's clear ends it."""
    services.account_add(name="acctA", provider="codex")
    now = timezone.now()
    spent = Window(name="5h", used=1.0, status=REJECTED, resets_at=now + HOUR * 4)
    # Held exhausted (as loopsweb's confirmation records it: no step of a task).
    windows_record(account="acctA", provider="codex", windows=[spent], step_run_id=None)
    refill = Window(name="5h", used=0.0, status="allowed", resets_at=now + HOUR * 5)
    weekly = Window(name="7d", used=0.3, status="allowed", resets_at=now + WEEK)
    written, claimed = windows_claimed(
        account="acctA",
        provider="codex",
        windows=[refill, weekly],
        step_run_id=_step("acctA").id,
    )
    assert written == 1 and claimed == []  # the weekly one only
    held = {w.name: w for w in latest_windows(["acctA"])["acctA"]}
    assert held["5h"].used == 1.0 and held["5h"].status == REJECTED
    assert held["7d"].used == pytest.approx(0.3)
    # The operator's word outranks it: cleared, a step's reading counts again.
    services.account_clear(name="acctA", windows=True)
    windows_claimed(
        account="acctA",
        provider="codex",
        windows=[refill],
        step_run_id=_step("acctA").id,
    )
    held = {w.name: w for w in latest_windows(["acctA"])["acctA"]}
    assert held["5h"].used == 0.0


def _routed(max_attempts: str) -> str:
    """A work item admitted by a route (its run's `created` event as an admission writes
    it); its id."""
    result = route(event=generic_event(), max_attempts=max_attempts, retry_backoff="30")
    assert result.work_item is not None and result.run is not None
    return result.work_item.id


def _on_latest(item_id: str, account: str) -> WorkflowStepRun:
    """A step of the item's newest run on `account`."""
    run = WorkflowRun.objects.filter(work_item_id=item_id).order_by("-id").first()
    return make_step_run(
        workflow_run=run, account_profile=account, step_id=f"probe-{account}"
    )


def _fail_latest(item_id: str) -> None:
    run = WorkflowRun.objects.filter(work_item_id=item_id).order_by("-id").first()
    assert run is not None
    services.run_claim(run_id=run.id, worker="w:1")
    services.run_finalize(run_id=run.id, status=RunStatus.FAILED, error="boom")


@pytest.mark.django_db
def test_an_operator_retry_starts_the_task_bound_afresh() -> None:
    """After acct-a's mark, the item's loop retry is the same task: acct-b's report parks
    it. An operator's retry (routing/admission/retry.py) starts the bound afresh: acct-b
    is marked, and the bound holds again within the new admission (acct-c parks)."""
    looped = _routed(max_attempts="2")
    assert _report(_on_latest(looped, "acct-a")).taken
    _fail_latest(looped)  # the loop retries it: a new run, `retryOf`
    assert WorkflowRun.objects.filter(work_item_id=looped).count() == 2
    parked = _report(_on_latest(looped, "acct-b"))
    assert not parked.taken and parked.parked == PARKED_REASONS[COOLDOWN]
    assert not AccountCooldown.objects.filter(pk="acct-b").exists()

    retried = _routed(max_attempts="1")
    assert _report(_on_latest(retried, "acct-a")).taken
    _fail_latest(retried)  # no attempt left: the item fails
    retry_work_item(item_id=retried, actor="ops")
    assert WorkflowRun.objects.filter(work_item_id=retried).count() == 2
    marked = _report(_on_latest(retried, "acct-b"))
    assert marked.taken and marked.parked is None
    assert AccountCooldown.objects.filter(pk="acct-b").exists()
    again = _report(_on_latest(retried, "acct-c"))
    assert not again.taken and again.parked == PARKED_REASONS[COOLDOWN]


@pytest.mark.django_db
def test_a_run_without_a_work_item_is_its_own_task() -> None:
    run = make_run()
    a = make_step_run(workflow_run=run, account_profile="acctA", step_id="worker")
    b = make_step_run(workflow_run=run, account_profile="acctB", step_id="verifier")
    assert _report(a).taken
    assert _report(b).parked is not None
    assert _report(_step("acctB")).taken


def test_a_claim_survives_the_queue_as_a_dict() -> None:
    claim = Claim(
        account="acctA",
        kind=WINDOW,
        until=timezone.now() + WEEK,
        reason="r",
        tool="claude",
        window={"window": "7d", "used": 1.0, "status": REJECTED},
    )
    assert Claim.from_dict(claim.to_dict()) == claim
