"""The admission's reads: what each returns, and that each is one round trip."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import AccountCooldown, RunStatus, SpecStatus, StepStatus
from ledger.selectors import account_load, account_state, admission_rows
from tests.factories import (
    make_run,
    make_spec,
    make_step_run,
    make_work_item,
)

pytestmark = pytest.mark.django_db


def test_admission_rows_finds_the_item_its_invocation_and_the_active_spec() -> None:
    key = "generic-event:ci:evt-1"
    with CaptureQueriesContext(connection) as captured:
        nothing = admission_rows(
            route_key="generic-event", idempotency_key=key, workflow_name="wf-1"
        )
    assert len(captured) == 1
    assert (nothing.work_item_id, nothing.invocation_id, nothing.spec_id) == (
        None,
        None,
        None,
    )

    item = make_work_item(idempotency_key=key)
    make_spec(name="wf-1", status=SpecStatus.ARCHIVED)
    active = make_spec(name="wf-1")
    found = admission_rows(
        route_key="generic-event", idempotency_key=key, workflow_name="wf-1"
    )
    assert found.work_item_id == item.id
    assert found.invocation_id == item.invocation_id
    assert found.spec_id == active.id

    # Another route with the same key has no item of its own; the invocation is shared.
    other = admission_rows(
        route_key="todos-task", idempotency_key=key, workflow_name="wf-2"
    )
    assert other.work_item_id is None and other.spec_id is None
    assert other.invocation_id == item.invocation_id


def test_account_state_reads_running_reserved_and_cooling_in_one_statement() -> None:
    now = timezone.now()
    running = make_run(status=RunStatus.RUNNING)
    make_step_run(workflow_run=running, status=StepStatus.RUNNING, account_profile="a1")
    queued = make_run(status=RunStatus.QUEUED)
    make_step_run(workflow_run=queued, sequence=0, account_profile="a2")
    make_step_run(workflow_run=queued, sequence=1, account_profile="a1")
    until = now + timedelta(minutes=7)
    AccountCooldown.objects.create(account_profile="a3", until=until)
    AccountCooldown.objects.create(
        account_profile="a4", until=now - timedelta(seconds=1)
    )

    with CaptureQueriesContext(connection) as captured:
        state = account_state(now=now)
    assert len(captured) == 1
    assert state.load.running == {"a1": 1}
    assert state.load.reserved == {"a2": 1}  # only the queued run's first account step
    assert state.cooling == {"a3": until}  # aware, equal to what was stored; a4 expired
    assert state.load.total() == {"a1": 1, "a2": 1}

    # Without `now` there is no cooling branch, and the load is the same.
    assert account_state().cooling == {}
    assert account_load() == state.load


def test_account_state_with_only_cooldowns_and_with_nothing() -> None:
    now = timezone.now()
    assert account_state(now=now).load.total() == {}
    AccountCooldown.objects.create(account_profile="a1", until=now + timedelta(hours=1))
    state = account_state(now=now)
    assert list(state.cooling) == ["a1"] and state.load.total() == {}


def test_admission_rows_can_read_the_active_counts_in_the_same_statement() -> None:
    from ledger.selectors import active_counts

    make_work_item(route_scope="s1", project_key="/p", status="admitted")
    make_work_item(route_scope="s1", project_key="/q", status="running")
    make_work_item(route_scope="s1", project_key="/p", status="succeeded")
    make_work_item(
        route_scope="s2", project_key="/p", project_group="g", status="admitted"
    )
    for scope, project, group in (
        ("s1", "/p", None),
        ("s2", "/p", "g"),
        (None, None, None),
    ):
        with CaptureQueriesContext(connection) as captured:
            found = admission_rows(
                route_key="generic-event",
                idempotency_key="none",
                workflow_name="wf",
                counts=True,
                scope=scope,
                project_key=project,
                project_group=group,
            )
        assert len(captured) == 1
        assert found.active == active_counts(
            scope=scope, project_key=project, project_group=group
        )
    assert (found.active.scope, found.active.project) == (
        3,
        0,
    )  # unscoped: every active
    without = admission_rows(
        route_key="generic-event", idempotency_key="none", workflow_name="wf"
    )
    assert without.active is None


def test_account_state_reads_the_named_accounts_limits_in_the_same_statement() -> None:
    from ledger.models import Account
    from ledger.selectors import AccountLimits, account_registry

    Account.objects.create(name="on", provider="codex", max_running=2)
    Account.objects.create(name="off", provider="codex", enabled=False)
    Account.objects.create(name="other", provider="codex", max_running=9)
    now = timezone.now()
    AccountCooldown.objects.create(account_profile="on", until=now + timedelta(hours=1))
    with CaptureQueriesContext(connection) as captured:
        state = account_state(now=now, accounts=[" on", "off", "unregistered"])
    assert len(captured) == 1
    assert state.limits == {
        "on": AccountLimits(enabled=True, max_running=2),
        "off": AccountLimits(enabled=False, max_running=None),
    }
    assert list(state.cooling) == ["on"]
    registry = account_registry(["on", "off"])
    assert {n: (r.enabled, r.max_running) for n, r in registry.items()} == {
        n: (lim.enabled, lim.max_running) for n, lim in state.limits.items()
    }
    assert account_state(now=now).limits == {}  # not asked: no registry branch
