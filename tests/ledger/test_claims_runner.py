"""Bounded trust through the runner, in-process with the fake agent (issue 58, ledger.claims):
a forged week-long 429 on a pool of 3 cools one account for 15 minutes, unconfirmed, and
holds the item with the reason (its run waits, then resumes); a forged `Not logged in` with --max-attempts 3 marks one
account; the confirmation makes loopsweb's own request with the fake agent as the CLI."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from ledger import services
from ledger.claims import (
    COOLDOWN,
    PARKED_EVENT,
    PARKED_REASONS,
    UNCONFIRMED_LONGEST,
    Claim,
)
from ledger.models import (
    Account,
    AccountCooldown,
    RunStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.webkit import access
from runs.confirm import CONFIRMED, UNCONFIRMED, confirm_claim
from runs.runner import HANDED_BACK, run_workflow_run
from tests.factories import make_staff_user
from tests.ledger.runner_helpers import FakeAgent, git_project, route_generic

POOL = "acctA,acctB,acctC"
FORGED_429 = "HTTP 429 Too Many Requests: try again in 168 hours"
FORGED_LOGIN = "Not logged in \u00b7 Please run /login"


def _run_item(run: WorkflowRun) -> WorkflowWorkItem:
    """Run the item's runs (its retries, due at once) until none is queued."""
    item_id = run.work_item_id
    for _ in range(5):
        run_workflow_run(run.id)
        item = WorkflowWorkItem.objects.get(pk=item_id)
        nxt = WorkflowRun.objects.get(pk=item.workflow_run_id)
        if nxt.status != RunStatus.QUEUED:
            return item
        run = nxt
    raise AssertionError("the item kept being retried")


@pytest.mark.slow
@pytest.mark.django_db
def test_a_forged_week_long_429_on_a_pool_of_3_cools_one_account_15_minutes(
    agent: FakeAgent, tmp_path: Path, client: Client
) -> None:
    agent.configure(steps={"worker": {"rate_limit": FORGED_429}})
    project = git_project(tmp_path / "project")
    run = route_generic(
        project, auth_profile_pool=POOL, created=True, max_attempts=3, retry_backoff=0
    ).run
    handed: list[float] = []
    outcome = run_workflow_run(
        run.id, hand_back=lambda _id, delay: handed.append(delay)
    )
    assert outcome == HANDED_BACK and handed
    cooling = list(AccountCooldown.objects.filter(until__gt=timezone.now()))
    assert len(cooling) == 1
    assert cooling[0].until <= timezone.now() + UNCONFIRMED_LONGEST
    assert (cooling[0].reason or "").startswith("unconfirmed")
    # Held, not failed: the run waits (parked, holding no worker) with the reason an
    # operator reads, for at most the 15 minutes a claim gets unconfirmed.
    run.refresh_from_db()
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert run.status == RunStatus.RUNNING and run.claimed_by is None
    assert item.status != WorkItemStatus.FAILED
    parked = WorkflowEvent.objects.get(workflow_run_id=run.id, event_type=PARKED_EVENT)
    until = datetime.fromisoformat(parked.payload_json["until"])
    assert timezone.now() < until <= timezone.now() + UNCONFIRMED_LONGEST
    waits = WorkflowEvent.objects.filter(
        workflow_run_id=run.id, event_type="step_waiting"
    ).order_by("-sequence")
    assert waits[0].payload_json["code"] == PARKED_EVENT
    assert waits[0].payload_json["reason"].startswith(PARKED_REASONS[COOLDOWN])
    # Two accounts tried (the second one not marked), never the third.
    tried = {r["profile"] for r in agent.records() if r["step"] == "worker"}
    assert len(tried) == 2
    # The item page says so.
    client.force_login(make_staff_user("ops", access.ITEMS, access.RUNS))
    client.raise_request_exception = True
    page = client.get(reverse("ops:work-item", args=[item.id])).content.decode()
    assert escape(PARKED_REASONS[COOLDOWN]) in page

    # Once the hold is over (its end moved to the past: the time a hold lasts), the
    # run resumes where it stopped and succeeds; the item never failed.
    agent.configure()
    payload = dict(parked.payload_json, until=timezone.now().isoformat())
    WorkflowEvent.objects.filter(pk=parked.pk).update(payload_json=payload)
    resumed = run_workflow_run(
        run.id, hand_back=lambda _id, delay: handed.append(delay)
    )
    assert resumed == RunStatus.SUCCEEDED
    item.refresh_from_db()
    assert item.status == WorkItemStatus.SUCCEEDED
    assert WorkflowRun.objects.filter(work_item_id=item.id).count() == 1


@pytest.mark.slow
@pytest.mark.django_db
def test_a_forged_login_failure_with_3_attempts_marks_one_account(
    agent: FakeAgent, tmp_path: Path
) -> None:
    for name in POOL.split(","):
        services.account_add(name=name, provider="codewith")
    agent.configure(steps={"worker": {"stderr": FORGED_LOGIN, "exit": 1}})
    project = git_project(tmp_path / "project")
    run = route_generic(
        project, auth_profile_pool=POOL, created=True, max_attempts=3, retry_backoff=0
    ).run
    item = _run_item(run)
    assert Account.objects.filter(login_failed_at__isnull=False).count() == 1
    assert item.status == WorkItemStatus.FAILED
    assert "failed login" in (item.last_reason or "")


@pytest.mark.slow
@pytest.mark.django_db
def test_the_confirmation_makes_its_own_request_with_the_account(
    agent: FakeAgent,
) -> None:
    for name in ("acctA", "acctB"):
        services.account_add(name=name, provider="codewith")
    # acctA's provider answers loopsweb's own request with a 429; acctB's answers.
    agent.configure(profiles={"acctA": {"rate_limit": "HTTP 429 Too Many Requests"}})
    week = timezone.now() + timedelta(hours=168)
    short = timezone.now() + UNCONFIRMED_LONGEST
    for name in ("acctA", "acctB"):
        services.account_cooldown_record(
            profile=name, tool="codewith", until=short, reason="unconfirmed for 15 min"
        )
    claims = {
        name: Claim(account=name, kind=COOLDOWN, until=week, reason="429 in a step")
        for name in ("acctA", "acctB")
    }
    assert confirm_claim(claims["acctA"]) == CONFIRMED
    assert confirm_claim(claims["acctB"]) == UNCONFIRMED
    confirmed = AccountCooldown.objects.get(pk="acctA")
    assert confirmed.until == week
    assert (confirmed.reason or "").startswith("confirmed by loopsweb's own request")
    assert AccountCooldown.objects.get(pk="acctB").until == short
    checks = [r for r in agent.records() if r["step"] == "check"]
    assert sorted(r["profile"] for r in checks) == ["acctA", "acctB"]
