"""A crowded installation for the /ops/ pages' fit at 1400 px: 24 registered
accounts over three providers, half of them cooling down with a provider's long message,
rate-limit windows (one a runner's 429 whose reset has passed), a 1-minute schedule's idle
drains, a drain cap on a scope the API admitted into without one, and a work item with a
title and a step that left processes behind.

Written through the real services where the page reads what they write (cooldowns, windows,
admissions, drains); runs and steps through the factories (the runner is not under test).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from domain.windows import Window
from ledger.models import Account, RunStatus, StepStatus, WorkflowWorkItem
from ledger.services import account_cooldown_record
from ledger.windows import windows_record
from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import DrainRecord
from tests.factories import make_step_run
from tests.routing.helpers import generic_event, route

PROVIDERS = ("codex", "claude", "opencode")
ACCOUNTS = 24
# What a provider says with its 429: long, with an unbroken id and a URL.
LONG_REASON = (
    "claude rate limit on step verifier: 429 "
    '{"type":"error","error":{"type":"rate_limit_error","message":"This request would '
    "exceed the rate limit for your organization (org_01HZX4Q9V7K2M3N4P5R6S7T8U9) of "
    "400,000 input tokens per minute. For details, refer to: "
    "https://docs.anthropic.com/en/api/rate-limits?request_id=req_011CX9aBcDeFgHiJkLmNoPqRsTuVwXyZ "
    'You can see the response headers for current usage."}}'
)
TASK_TITLE = "Fix the flaky checkout test on the nightly pipeline"
# A drain's --max-active on this scope; the API admits there without one.
API_SCOPE = "api-scope"


@dataclass(frozen=True)
class Crowd:
    accounts: list[str]
    cooling: list[str]
    item: WorkflowWorkItem
    expired_window_account: str


def expired_429(now: datetime) -> Window:
    """The window a runner's 429 records (ledger/services/cooldowns.py), its reset 9
    minutes past."""
    return Window(
        name="rate_limit",
        status="rejected",
        resets_at=now - timedelta(minutes=9),
        source="429 seen by the runner",
        observed_at=now - timedelta(minutes=40),
    )


def account_name(i: int) -> str:
    """A name as operators give them: long, and with no place a line may break."""
    return f"{PROVIDERS[i % len(PROVIDERS)]}_platform_team_subscription_{i:02d}"


def crowded(now: datetime | None = None) -> Crowd:
    now = now or timezone.now()
    names = [account_name(i) for i in range(ACCOUNTS)]
    cooling = []
    for i, name in enumerate(names):
        provider = PROVIDERS[i % len(PROVIDERS)]
        Account.objects.create(
            name=name,
            provider=provider,
            env_json={"CODEX_HOME": f"/srv/agents/{name}/a/long/login/directory"},
        )
        if i % 2 == 0:
            cooling.append(name)
            account_cooldown_record(
                profile=name,
                tool=provider,
                until=now + timedelta(minutes=20 + i),
                reason=LONG_REASON,
                now=now,
            )
        windows_record(
            account=name,
            provider=provider,
            windows=[
                Window(
                    name="5h",
                    used=0.3 + i / 100,
                    resets_at=now + timedelta(hours=2),
                    source="codex rollout",
                    observed_at=now - timedelta(minutes=3),
                )
            ],
            now=now,
        )
    expired = names[1]
    windows_record(
        account=expired, provider="claude", windows=[expired_429(now)], now=now
    )
    _idle_drains(now)
    _api_scope()
    return Crowd(
        accounts=names,
        cooling=cooling,
        item=_item(names[0], now),
        expired_window_account=expired,
    )


def _idle_drains(now: datetime) -> None:
    """A drain that admitted an inbox event, then twelve a 1-minute schedule ran with
    nothing to do (one a minute, the latest a minute ago)."""
    options = drain_options(
        "generic", {"max_active": 5, "limit": 10}, name="every-minute"
    )
    inbox_ingest([(1, generic_event(project="/srv/inbox"))])
    admitted = drain_run(options=options, env={}).record_id
    DrainRecord.objects.filter(pk=admitted).update(
        started_at=now - timedelta(minutes=13)
    )
    for minute in range(12, 0, -1):
        record = drain_run(options=options, env={}).record_id
        DrainRecord.objects.filter(pk=record).update(
            started_at=now - timedelta(minutes=minute)
        )


def _api_scope() -> None:
    """Three items routed into API_SCOPE without a --max-active (as the API routes), then
    a drain of the scope capped at 1."""
    for n in range(3):
        assert (
            route(
                event=generic_event(project=f"/srv/api{n}"), max_active_scope=API_SCOPE
            ).kind
            == "created"
        )
    drain_run(
        options=drain_options(
            "generic", {"max_active": 1, "max_active_scope": API_SCOPE}, name="api-cap"
        ),
        env={},
    )


def _item(profile: str, now: datetime) -> WorkflowWorkItem:
    """An item whose task has a title, and a finished run with a step that left two
    processes running (the step guard ended them)."""
    admitted = route(
        event=generic_event(project="/srv/titled", message=TASK_TITLE),
    )
    item = admitted.work_item
    assert item is not None and admitted.run is not None
    run = admitted.run
    run.status = RunStatus.SUCCEEDED
    run.finished_at = now
    run.save(update_fields=["status", "finished_at"])
    make_step_run(
        workflow_run=run,
        step_id="checker",
        status=StepStatus.SUCCEEDED,
        account_profile=profile,
        account_tool="codex",
        exit_code=0,
        processes_ended=2,
        started_at=now - timedelta(minutes=4),
        finished_at=now - timedelta(minutes=1),
    )
    return item
