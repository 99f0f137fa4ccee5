"""What an agent prints is evidence, not orders (docs/windows.md §7, ledger/claims.py,
ledger/windows.py, agents/usage.py), through real processes: the hostile agent stand-in
(tests/hostile_agent.py) as claude, codex and codewith, events routed by `manage.py
route_event` (a second terminal) and run by a run cluster.

- Forged windows: a claude `rate_limit_event` claiming the 5-hour window `rejected` until
  9999-12-31, and a codex rollout file the agent wrote in its own CODEX_HOME claiming 100 %,
  are recorded for 15 minutes, "unconfirmed"; when loopsweb's own request meets a real rate
  limit (`HOSTILE_PROVIDER=rate-limited`) the claim stands, capped at the window's own
  length from the observation; a window that is not exhausted is capped the same way.
- Forged usage: a real-looking result then a zero one is summed, not replaced; two steps
  claiming 9e18 and 2**63-1 tokens at a cost of Infinity are clamped, the run succeeds,
  and /ops/, /ops/accounts/, the item's page, /metrics and the read API answer 200 with
  no NaN or Infinity.
- Forged window names: 550 names from one step leave 16 for the account, and /metrics
  carries 16 of them.
- Injection through `/proc/<ppid>/fd/1`: a tool of the agent writes a forged 429 (or `Not
  logged in`) into its CLI's stdout and kills it; the task still marks at most one account,
  for at most 15 minutes, unconfirmed, and is parked (ledger/services/cooldowns.py
  `_task_bound`).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from django_q.models import Task

from agents.usage import MAX_TOKENS
from agents.window_parse import SOURCE_CLAUDE, SOURCE_CODEX
from ledger import services
from ledger.claims import (
    CONFIRM_TASK,
    COOLDOWN,
    LOGIN,
    PARKED_EVENT,
    PARKED_REASONS,
    UNCONFIRMED_LONGEST,
)
from ledger.models import (
    Account,
    AccountCooldown,
    AccountWindow,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepRun,
    WorkItemStatus,
)
from ledger.windows import MAX_WINDOWS_PER_ACCOUNT
from tests.hostile_agent import FORGED, FORGED_NAMES
from tests.ledger.hostile_routes import ended, hostile_env, item_steps, route_hostile
from tests.ledger.runner_helpers import git_project
from tests.processes import start_qcluster, stop_process_group
from tests.routing.api.helpers import bearer, make_token
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    # The agent sandbox (runs/sandbox.py): what the agent writes in its account's home
    # and its CLI's stdout, it writes from inside the sandbox the CLI and its tools share.
    pytest.mark.sandboxed,
]

FIVE_HOURS = timedelta(hours=5)
WEEK = timedelta(days=7)
CONFIRMED = "confirmed by loopsweb's own request"


def _accounts(tmp_path: Path, provider: str, variable: str | None, *names: str) -> str:
    """Register `names` for `provider`, each with its own login directory in `variable`;
    the pool option's value."""
    for name in names:
        env = {}
        if variable is not None:
            home = tmp_path / "homes" / name
            home.mkdir(parents=True)
            env[variable] = str(home)
        services.account_add(name=name, provider=provider, env=env)
    return ",".join(names)


def _strict_json(text: str) -> Any:
    """`text` as JSON that has no NaN or Infinity (json.loads accepts both)."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _forged_window(step: WorkflowStepRun, source: str) -> None:
    """The 5-hour window of the step's account as the step claimed it (100 % or rejected,
    until 9999-12-31): 15 minutes unconfirmed (recorded before the step finished), then,
    confirmed by loopsweb's own request, the window's own length from that observation;
    the weekly one (half used) a week from its observation."""
    rows = list(AccountWindow.objects.filter(account_profile=step.account_profile))
    five = [row for row in rows if row.window == "5h"]
    (unconfirmed,) = [row for row in five if row.source.startswith("unconfirmed")]
    assert "9999-12-31" in unconfirmed.source and source in unconfirmed.source
    assert unconfirmed.resets_at <= step.finished_at + UNCONFIRMED_LONGEST
    (confirmed,) = [row for row in five if row.source.startswith(CONFIRMED)]
    assert confirmed.resets_at == confirmed.observed_at + FIVE_HOURS
    (week,) = [row for row in rows if row.window == "7d"]
    assert week.used == pytest.approx(0.5) and week.source == source
    assert week.resets_at == week.observed_at + WEEK


def _confirmations(count: int) -> list[Task] | None:
    """The confirmations that ran (runs/confirm.py), once `count` have."""
    tasks = list(Task.objects.filter(func=CONFIRM_TASK))
    return tasks if len(tasks) >= count else None


def _pages_answer(item_id: str) -> str:
    """/ops/, /ops/accounts/, the item's page, the API and /metrics answer 200, with no
    NaN or Infinity; the /metrics text."""
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    for url in ("/ops/", "/ops/accounts/", f"/ops/items/{item_id}/"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert "Infinity" not in response.content.decode(), url
    _, token = make_token("metrics", "read")
    for url in ("/api/v1/accounts", f"/api/v1/work-items/{item_id}"):
        response = client.get(url, **bearer(token))
        assert response.status_code == 200, url
        _strict_json(response.content.decode())
    response = client.get("/metrics", **bearer(token))
    assert response.status_code == 200
    text = response.content.decode()
    values = [line.rsplit(" ", 1)[-1] for line in text.splitlines() if line[:1] != "#"]
    assert not [v for v in values if v.lower() in ("nan", "inf", "+inf", "-inf")]
    return text


def test_forged_windows_usage_and_names_are_bounded(tmp_path: Path) -> None:
    windows = _accounts(tmp_path, "claude", "CLAUDE_CONFIG_DIR", "cw1", "cw2")
    names = _accounts(tmp_path, "claude", "CLAUDE_CONFIG_DIR", "cn1", "cn2")
    rollout = _accounts(tmp_path, "codex", "CODEX_HOME", "xw1", "xw2")
    env = hostile_env(
        tmp_path / "hostile",
        "claude",
        "codex",
        HOSTILE_PROVIDER="rate-limited",
        LOOPSWEB_RUN_WORKERS="3",
    )
    cluster = start_qcluster(env, tmp_path / "runs.log", cluster="loopsweb-runs")
    try:
        items = [
            route_hostile(
                env,
                git_project(tmp_path / "p1"),
                "forge-windows,forge-usage",
                "--provider",
                "claude",
                "--auth-profile-pool",
                windows,
            ),
            route_hostile(
                env,
                git_project(tmp_path / "p2"),
                "forge-names,forge-usage-huge",
                "--provider",
                "claude",
                "--auth-profile-pool",
                names,
            ),
            route_hostile(
                env,
                git_project(tmp_path / "p3"),
                "forge-windows",
                "--provider",
                "codex",
                "--auth-profile-pool",
                rollout,
            ),
        ]
        done = [wait_for(lambda i=i: ended(i), what=f"item {i} to end") for i in items]
        # loopsweb's own request with each account whose window the task claimed spent.
        confirms = wait_for(lambda: _confirmations(2), what="both confirmations")
    finally:
        stop_process_group(cluster)
    assert [item.status for item in done] == [WorkItemStatus.SUCCEEDED] * 3, [
        item.last_reason for item in done
    ]
    assert sorted(task.result for task in confirms) == ["confirmed", "confirmed"]
    assert not AccountWindow.objects.filter(resets_at__year=9999).exists()

    # Windows: the worker's account of each task, capped; the verifier's untouched.
    by_step = {s.step_id: s for s in item_steps(items[0])}
    _forged_window(by_step["worker"], SOURCE_CLAUDE)
    assert not AccountWindow.objects.filter(
        account_profile=by_step["verifier"].account_profile
    ).exists()
    codex_steps = {s.step_id: s for s in item_steps(items[2])}
    _forged_window(codex_steps["worker"], SOURCE_CODEX)

    # Usage: the real-looking result and the zero one after it are summed.
    worker = by_step["worker"]
    assert (worker.usage_input_tokens, worker.usage_output_tokens) == (300_000, 100_000)
    assert worker.usage_cost_usd == pytest.approx(42.5)
    # 9e18 and 2**63-1 tokens at Infinity, in both steps: clamped, no cost, run succeeded.
    huge = item_steps(items[1])
    assert len(huge) == 2
    for step in huge:
        assert (step.usage_input_tokens, step.usage_output_tokens) == (MAX_TOKENS,) * 2
        assert step.usage_cost_usd is None

    # Names: 550 offered by one step, 16 kept, each observed once.
    named = {s.step_id: s for s in huge}["worker"].account_profile
    rows = AccountWindow.objects.filter(account_profile=named)
    assert rows.values("window").distinct().count() == MAX_WINDOWS_PER_ACCOUNT
    assert rows.count() == MAX_WINDOWS_PER_ACCOUNT

    text = _pages_answer(items[1])
    gauges = [
        line
        for line in text.splitlines()
        if line.startswith("loopsweb_account_window_") and f'account="{named}"' in line
    ]
    # One used-ratio gauge per kept name (the names carry no reset)...
    assert len(gauges) == MAX_WINDOWS_PER_ACCOUNT
    # ... so /metrics, the whole of it, is smaller than the 550 names' gauges would be.
    assert len(text) < FORGED_NAMES * min(len(line) for line in gauges)


def _parked(item_id: str) -> WorkflowEvent | None:
    """The `task_parked` event of the item's task (ledger/claims.py rule 1), once written."""
    runs = WorkflowRun.objects.filter(work_item_id=item_id).values("id")
    return WorkflowEvent.objects.filter(
        workflow_run_id__in=runs, event_type=PARKED_EVENT
    ).first()


def _printed(item_id: str, line: str) -> bool:
    """Whether a step of the item has `line` in its stored output."""
    return any(line in (step.stdout or "") for step in item_steps(item_id))


def test_lines_injected_into_the_clis_stdout_mark_at_most_one_account(
    tmp_path: Path,
) -> None:
    cooling = _accounts(tmp_path, "codewith", None, "ia", "ib", "ic")
    login = _accounts(tmp_path, "codewith", None, "la", "lb", "lc")
    env = hostile_env(tmp_path / "hostile", "codewith", LOOPSWEB_RUN_WORKERS="3")
    cluster = start_qcluster(env, tmp_path / "runs.log", cluster="loopsweb-runs")
    try:
        limited = route_hostile(
            env,
            git_project(tmp_path / "p1"),
            "inject-429",
            "--auth-profile-pool",
            cooling,
        )
        parked = wait_for(
            lambda: _parked(limited), what="the injected 429's task to be parked"
        )
        wait_for(
            lambda: Task.objects.filter(func=CONFIRM_TASK).first(),
            what="the confirmation to run",
        )
        refused = route_hostile(
            env,
            git_project(tmp_path / "p2"),
            "inject-login",
            "--auth-profile-pool",
            login,
            "--max-attempts",
            "3",
            "--retry-backoff",
            "0",
        )
        item = wait_for(lambda: ended(refused), what="the injected login's item to end")
    finally:
        stop_process_group(cluster)
    # The forged lines reached the runner, written by the tool (the agent prints none).
    assert _printed(limited, FORGED["forge-429"])
    assert _printed(refused, FORGED["forge-login"])
    now = timezone.now()
    (cooled,) = AccountCooldown.objects.filter(until__gt=now)
    assert cooled.account_profile in cooling.split(",")
    assert cooled.until <= now + UNCONFIRMED_LONGEST
    assert (cooled.reason or "").startswith("unconfirmed")
    assert Task.objects.get(func=CONFIRM_TASK).result == "unconfirmed"
    assert parked.payload_json["kind"] == COOLDOWN
    assert parked.payload_json["marked"] == cooled.account_profile
    assert parked.payload_json["account"] != cooled.account_profile

    assert Account.objects.filter(login_failed_at__isnull=False).count() <= 1
    assert item.status == WorkItemStatus.FAILED
    assert PARKED_REASONS[LOGIN] in (item.last_reason or "")
    assert WorkflowRun.objects.filter(work_item_id=refused).count() <= 3
