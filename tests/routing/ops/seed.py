"""Seed data for the ops page tests, written through the real services where practical.

- deferred work items: `route_event` with a full route-scope cap (a real deferral each, with
  its counts snapshot);
- deferred inbox events and drain records: `inbox_ingest` + `drain_run` (the pre-check holds
  events whose scope is full);
- account load and step history: factories for runs and steps (the runner is not under test),
  cooldowns through `account_cooldown_record`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from ledger.models import (
    AccountCooldown,
    RunStatus,
    StepReasonCode,
    StepStatus,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from ledger.services import account_cooldown_record, step_start
from routing.drains import DrainReport, drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from tests.factories import make_run, make_step_run, make_work_item
from tests.routing.helpers import generic_event, route

SCOPE = "ops-scope"


def deferred_items(
    n: int, *, start: int = 0, scope: str = SCOPE
) -> list[WorkflowWorkItem]:
    """One admitted item holding a cap of 1 on `scope`, then n deferred items, each in its own
    project and project group (so every per-project and per-group list grows with n)."""
    caps: dict[str, Any] = {"max_active": 1, "max_active_scope": scope}
    if start == 0:
        route(event=generic_event(project="/srv/holder", group="g-holder"), **caps)
    items = []
    for i in range(start, start + n):
        result = route(event=generic_event(project=f"/srv/p{i}", group=f"g{i}"), **caps)
        assert result.kind == "throttled", result.to_dict()
        assert result.work_item is not None
        items.append(result.work_item)
    return items


def redefer(envelope: dict[str, Any], times: int, *, scope: str = SCOPE) -> None:
    """Route the same event `times` more times while its scope is full: one deferral each."""
    for _ in range(times):
        assert (
            route(event=envelope, max_active=1, max_active_scope=scope).kind
            == "throttled"
        )


def drains(n: int, *, start: int = 0, inbox_events: int = 0) -> list[DrainReport]:
    """n real drains, each under its own schedule-like name (its scope) with caps and a pool.

    With inbox_events, the first drain sees that many events: one is admitted, the rest are
    held by the pre-check (deferred inbox events) and appear in its results.
    """
    if inbox_events:
        inbox_ingest(
            enumerate(
                (generic_event(project=f"/srv/in{i}") for i in range(inbox_events)),
                start=1,
            )
        )
    reports = []
    for i in range(start, start + n):
        options = drain_options(
            "generic",
            {
                "max_active": 1,
                "max_active_per_project_group": 3,
                "max_per_profile": 2,
                "auth_profile_pool": f"pool-a{i},pool-b{i}",
                "max_dispatch": 100,
                "limit": 100,
            },
            name=f"nightly-{i}",
        )
        reports.append(drain_run(options=options, env={}))
    return reports


def account_history(
    n: int, *, start: int = 0, now: datetime | None = None
) -> list[str]:
    """n accounts, each with a running step, a reserved (queued run) step, a failed step that
    hit a rate limit an hour ago, and a cooldown."""
    now = now or timezone.now()
    profiles = []
    for i in range(start, start + n):
        profile = f"acct-{i:02d}"
        profiles.append(profile)
        item = make_work_item(status="running", route_scope=SCOPE)
        running = make_run(work_item=item, invocation=item.invocation)
        make_step_run(
            workflow_run=running,
            step_id="worker",
            status=StepStatus.RUNNING,
            account_profile=profile,
            account_tool="codewith",
            started_at=now - timedelta(minutes=5),
        )
        queued = make_run(status=RunStatus.QUEUED)
        make_step_run(
            workflow_run=queued,
            step_id="worker",
            account_profile=profile,
            account_tool="codewith",
        )
        failed = make_run(status=RunStatus.FAILED)
        step = make_step_run(
            workflow_run=failed,
            step_id="verifier",
            status=StepStatus.FAILED,
            account_profile=profile,
            account_tool="claude",
            started_at=now - timedelta(hours=1, minutes=10),
            finished_at=now - timedelta(hours=1),
            error="agent exited with code 1; provider rate limit: HTTP 429 Too Many Requests",
            reason_code=StepReasonCode.RATE_LIMITED,
        )
        account_cooldown_record(
            profile=profile,
            tool="claude",
            until=now + timedelta(minutes=30),
            reason=f"claude rate limit on step verifier: 429 ({profile})",
            step_run=step,
            now=now,
        )
    return profiles


def waiting_step(profile: str, *, now: datetime | None = None) -> WorkflowStepRun:
    """A running run whose worker step waits for `profile` (cooling down): the real
    `step_start` refuses it and records the `step_waiting` event the overview reads."""
    now = now or timezone.now()
    if not AccountCooldown.objects.filter(
        account_profile=profile, until__gt=now
    ).exists():
        account_cooldown_record(
            profile=profile,
            tool="codewith",
            until=now + timedelta(minutes=20),
            reason=f"codewith rate limit ({profile})",
            now=now,
        )
    item = make_work_item(status="running", route_scope=SCOPE)
    run = make_run(work_item=item, invocation=item.invocation, claimed_by="seed-worker")
    step = make_step_run(
        workflow_run=run,
        step_id="worker",
        account_profile=profile,
        account_tool="codewith",
    )
    assert (
        step_start(step_run_id=step.pk, worker="seed-worker", now=now).started is False
    )
    step.refresh_from_db()
    return step
