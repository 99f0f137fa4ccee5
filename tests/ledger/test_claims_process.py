"""What an agent prints is evidence, not orders (issue 58, ledger.claims), through real
processes: the hostile agent stand-in (tests/hostile_agent.py, cases `forge-429` and
`forge-login`) as codewith, events routed by `manage.py route_event` (a second terminal) and
run by a run cluster. A forged week-long 429 on a pool of 3 cools at most one account, for at
most 15 minutes, unconfirmed (the run cluster's own request with the account passes), and
holds the item with the reason (its run parked, waiting); a forged `Not logged in` with
--max-attempts 3 marks at most one account."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone
from django_q.models import Task

from ledger import services
from ledger.claims import (
    CONFIRM_TASK,
    COOLDOWN,
    LOGIN,
    PARKED_REASONS,
    TASK_PARKED,
    UNCONFIRMED_LONGEST,
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
from tests.ledger.hostile_routes import ended, hostile_env, route_hostile
from tests.ledger.runner_helpers import git_project
from tests.processes import start_qcluster, stop_process_group
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _held(item_id: str) -> WorkflowRun | None:
    """The item's run once it waits, parked, for its task's hold (ledger.claims rule 1)."""
    run = WorkflowRun.objects.get(work_item_id=item_id)
    waiting = WorkflowEvent.objects.filter(
        workflow_run_id=run.id,
        event_type="step_waiting",
        payload_json__code=TASK_PARKED,
    ).exists()
    return run if waiting and run.claimed_by is None else None


def test_forged_limits_and_logins_mark_at_most_one_account(tmp_path: Path) -> None:
    for name in ("acctA", "acctB", "acctC", "acctD", "acctE", "acctF"):
        services.account_add(name=name, provider="codewith")
    env = hostile_env(tmp_path / "hostile", "codewith")
    cluster = start_qcluster(env, tmp_path / "runs.log", cluster="loopsweb-runs")
    try:
        forged = route_hostile(
            env,
            git_project(tmp_path / "p1"),
            "forge-429",
            "--auth-profile-pool",
            "acctA,acctB,acctC",
        )
        # Held, not failed: the run waits, parked (holding no run worker), with the
        # reason on its item, for at most the 15 minutes a claim gets unconfirmed.
        run = wait_for(lambda: _held(forged), what="the forged 429's task to be held")
        item = WorkflowWorkItem.objects.get(pk=forged)
        cooling = list(AccountCooldown.objects.filter(until__gt=timezone.now()))
        assert len(cooling) == 1
        assert cooling[0].until <= timezone.now() + UNCONFIRMED_LONGEST
        assert (cooling[0].reason or "").startswith("unconfirmed")
        assert item.status == WorkItemStatus.RUNNING
        assert (item.last_reason or "").startswith(PARKED_REASONS[COOLDOWN])
        assert run.status == RunStatus.RUNNING
        # The run cluster made its own request with the account: answered, unconfirmed.
        wait_for(
            lambda: Task.objects.filter(func=CONFIRM_TASK).first(),
            what="the confirmation to run",
        )
        assert Task.objects.get(func=CONFIRM_TASK).result == "unconfirmed"
        again = AccountCooldown.objects.get(pk=cooling[0].pk)
        assert again.until == cooling[0].until

        login = route_hostile(
            env,
            git_project(tmp_path / "p2"),
            "forge-login",
            "--auth-profile-pool",
            "acctD,acctE,acctF",
            "--max-attempts",
            "3",
            "--retry-backoff",
            "0",
        )
        item = wait_for(lambda: ended(login), what="the forged login's item to end")
        assert Account.objects.filter(login_failed_at__isnull=False).count() <= 1
        assert item.status == WorkItemStatus.FAILED
        assert PARKED_REASONS[LOGIN] in (item.last_reason or "")
        assert WorkflowRun.objects.filter(work_item_id=login).count() <= 3
    finally:
        stop_process_group(cluster)
