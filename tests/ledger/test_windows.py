"""The window ledger (ledger.windows) and admission steering by it, in-process on the real
database with the fake agent: recording and pruning, the estimate from step runs, an account
at 95 % not assigned, a spent pool deferring with window_exhausted, the dry-run plan making
the same choice, the step start failing over from a spent account, a 429 recorded; the
prediction: a step's spend read from the step runs' observations, an account predicted to
run out with its load dropped by admission, the dry-run, a step start and failover."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from agents.window_parse import SOURCE_CODEX
from domain import reasons
from domain.windows import Window
from ledger import services
from ledger.models import (
    Account,
    AccountWindow,
    RunStatus,
    WorkflowEvent,
    WorkItemDeferral,
)
from ledger.services.common import step_spec
from ledger.services.failover import step_failover
from ledger.windows import (
    KEEP_PER_WINDOW,
    latest_windows,
    parse_budgets,
    pool_windows,
    window_refusal,
    window_state,
    windows_record,
)
from runs.agent_step import StepWatch
from runs.processes import Limits
from runs.providers import Invocation
from runs.runner import run_workflow_run
from tests.factories import make_run, make_step_run
from tests.ledger.runner_helpers import FakeAgent, route_generic, steps_of
from tests.waiting import hang_deadline

pytestmark = pytest.mark.django_db

POOL = "acctA,acctB,acctC"


def spend(account: str, used: float = 0.95, *, minutes: int = 60, name="5h") -> None:
    windows_record(
        account=account,
        provider="codewith",
        windows=[
            Window(
                name=name,
                used=used,
                resets_at=timezone.now() + timedelta(minutes=minutes),
                source="test",
            )
        ],
    )


def spent_by_steps(account: str, *used: float) -> None:
    """Each fraction in `used` observed by its own step run of `account` (what the
    window watch records), a second apart, in one 5 h period."""
    run = make_run(status=RunStatus.SUCCEEDED)  # ended: no load, no active run
    resets = timezone.now() + timedelta(hours=1)
    start = timezone.now() - timedelta(minutes=5)
    for n, fraction in enumerate(used):
        step = make_step_run(
            workflow_run=run,
            step_id=f"w{n}",
            account_profile=account,
            status="succeeded",
        )
        windows_record(
            account=account,
            provider="codex",
            windows=[Window(name="5h", used=fraction, resets_at=resets, source="t")],
            step_run_id=step.id,
            now=start + timedelta(seconds=n),
        )


def test_the_latest_observation_per_window_counts_and_old_ones_are_pruned(
    settings: Any,
) -> None:
    now = timezone.now()
    for n in range(KEEP_PER_WINDOW + 5):
        windows_record(
            account="acctA",
            provider="codex",
            windows=[Window(name="5h", used=n / 100, source="codex rollout")],
            now=now + timedelta(seconds=n),
        )
    spend("acctB", 0.3, name="7d")
    assert (
        AccountWindow.objects.filter(account_profile="acctA").count() == KEEP_PER_WINDOW
    )
    (latest,) = latest_windows(["acctA"], now=now + timedelta(minutes=1))["acctA"]
    assert latest.used == pytest.approx((KEEP_PER_WINDOW + 4) / 100)
    # Observations older than LOOPSWEB_WINDOW_KEEP_DAYS go with the next record.
    settings.LOOPSWEB_WINDOW_KEEP_DAYS = 1
    spend("acctC", 0.1, name="5h")
    windows_record(
        account="acctC",
        provider="codex",
        windows=[Window(name="5h", used=0.2)],
        now=timezone.now() + timedelta(days=2),
    )
    assert not AccountWindow.objects.filter(account_profile="acctA").exists()


def test_the_estimate_counts_the_accounts_tokens_in_the_window() -> None:
    Account.objects.create(
        name="acctA", provider="codewith", window_budgets=parse_budgets(["5h=1000"])
    )
    run = make_run()
    now = timezone.now()
    for i, (tokens, age) in enumerate(((300, 10), (400, 100), (5000, 400))):
        make_step_run(
            workflow_run=run,
            step_id=f"s{i}",
            account_profile="acctA",
            status="succeeded",
            finished_at=now - timedelta(minutes=age),
            usage_input_tokens=tokens - 50,
            usage_output_tokens=50,
            usage_cost_usd=0.25,
        )
    (estimate,) = window_state(["acctA"], now=now)["acctA"]
    assert estimate.used == pytest.approx(0.7)  # the step 400 min ago is outside 5 h
    assert estimate.resets_at == now - timedelta(minutes=100) + timedelta(hours=5)
    assert "700 of 1000 tokens, $0.50" in estimate.source
    # What one step spends: the most a step within the window spent (domain.windows rule 10).
    assert estimate.estimated and estimate.spend == pytest.approx(0.4)
    # A provider observation still in force is fresher than the estimate.
    spend("acctA", 0.2)
    (seen,) = window_state(["acctA"], now=now)["acctA"]
    assert (seen.used, seen.source) == (0.2, "test")


@pytest.mark.parametrize(
    "bad", ["5h", "5h=", "5x=10", "5h=0", "5h=-1", "h=10", "5h=1e3"]
)
def test_bad_budgets_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--window"):
        parse_budgets([bad])


def test_an_account_at_95_percent_is_not_assigned_and_the_dry_run_agrees(
    tmp_path: Path,
) -> None:
    spend("acctA")
    plan = route_generic(tmp_path, "evt-w-dry", auth_profile_pool=POOL, dry_run=True)
    assert plan.account_profiles and "acctA" not in plan.account_profiles.values()
    for n in range(3):
        result = route_generic(
            tmp_path, f"evt-w-{n}", auth_profile_pool=POOL, max_per_profile=0
        )
        assert result.run is not None
        assert "acctA" not in (result.account_profiles or {}).values()
    # --max-window-used 1 lets it take work again.
    spend("acctB")
    spend("acctC")
    raised = route_generic(
        tmp_path, "evt-w-raised", auth_profile_pool=POOL, max_window_used=1.0
    )
    assert raised.run is not None


def test_off_assigns_an_account_at_95_percent_and_the_default_does_not(
    tmp_path: Path,
) -> None:
    for name in ("acctA", "acctB", "acctC"):
        spend(name)
    dry = route_generic(tmp_path, "evt-off-dry", auth_profile_pool=POOL, dry_run=True)
    assert dry.reason_code == reasons.WINDOW_EXHAUSTED
    off_dry = route_generic(
        tmp_path, "evt-off-dry2", auth_profile_pool=POOL, dry_run=True,
        max_window_used="off",
    )  # fmt: skip
    assert off_dry.reason_code is None and off_dry.account_profiles
    assigned: set[str] = set()
    for n in range(3):  # least loaded: the three runs spread over the three accounts
        result = route_generic(
            tmp_path, f"evt-off-{n}", auth_profile_pool=POOL, max_per_profile=0,
            max_window_used="off", created=True,
        )  # fmt: skip
        assigned |= set((result.account_profiles or {}).values())
        assert result.run is not None
        assert step_spec(result.run, "worker")["routing"]["maxWindowUsed"] == "off"
    assert "acctA" in assigned
    # A step start and a failover read `off` from the step's spec.
    spec: dict[str, Any] = {"routing": {"maxWindowUsed": "off"}}
    assert window_refusal("acctA", spec, timezone.now(), running=2) is None
    assert window_refusal("acctA", {"routing": {}}, timezone.now()) is not None
    found = pool_windows(["acctA", "acctB"], spec, timezone.now(), {"acctA": 1})
    assert found.kept == ["acctA", "acctB"] and not found.exhausted


def test_a_spent_pool_defers_with_window_exhausted_until_the_earliest_reset(
    tmp_path: Path,
) -> None:
    spend("acctA", minutes=30)
    spend("acctB", minutes=90)
    dry = route_generic(
        tmp_path, "evt-x", auth_profile_pool="acctA,acctB", dry_run=True
    )
    assert dry.reason_code == reasons.WINDOW_EXHAUSTED
    result = route_generic(tmp_path, "evt-x", auth_profile_pool="acctA,acctB")
    assert result.run is None
    assert result.reason_code == reasons.WINDOW_EXHAUSTED
    first = (timezone.now() + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M")
    assert first in (result.reason or "")
    deferral = WorkItemDeferral.objects.get(work_item=result.work_item)
    assert deferral.reason_code == reasons.WINDOW_EXHAUSTED
    windows = deferral.counts_json["windows"]
    assert {name: [w["used"] for w in seen] for name, seen in windows.items()} == {
        "acctA": [0.95],
        "acctB": [0.95],
    }


@pytest.mark.slow
def test_a_step_whose_account_spent_its_window_after_admission_moves(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = route_generic(
        tmp_path, "evt-w-move", auth_profile_pool=POOL, created=True
    ).run
    steps = steps_of(run)
    worker, verifier = (
        steps["worker"].account_profile,
        steps["verifier"].account_profile,
    )
    free = ({"acctA", "acctB", "acctC"} - {worker, verifier}).pop()
    spend(worker)

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    assert steps_of(run)["worker"].account_profile == free
    move = WorkflowEvent.objects.get(workflow_run=run, event_type="step_account_moved")
    assert move.payload_json["code"] == reasons.WINDOW_EXHAUSTED
    assert f"account {worker} at its window budget" in move.payload_json["reason"]


# How the only other member's window stands -> whether the step moves onto it.
FAILOVER_CASES = [
    ("at 95 %", False),
    ("at 70 %, 35 % a step: predicted to reach 105 %", False),
    ("at 70 %, nothing known of a step", True),
]


@pytest.mark.slow
@pytest.mark.parametrize(("other", "moves"), FAILOVER_CASES)
def test_failover_never_moves_a_step_onto_a_spent_account(
    agent: FakeAgent, tmp_path: Path, other: str, moves: bool
) -> None:
    run = route_generic(
        tmp_path, "evt-w-none", auth_profile_pool="acctA,acctB", created=True
    ).run
    steps = steps_of(run)
    worker, verifier = (
        steps["worker"].account_profile,
        steps["verifier"].account_profile,
    )
    services.account_cooldown_record(
        profile=worker,
        tool="codewith",
        until=timezone.now() + timedelta(minutes=10),
        reason="429",
    )
    if other == FAILOVER_CASES[0][0]:
        spend(verifier)
    elif other == FAILOVER_CASES[1][0]:
        spent_by_steps(verifier, 0.35, 0.7)
    else:
        spend(verifier, 0.7)
    step_failover(
        run=run,
        step=steps["worker"],
        steps=list(steps.values()),
        code="cooldown",
        reason="cooling",
        now=timezone.now(),
    )
    assert steps_of(run)["worker"].account_profile == (verifier if moves else worker)


@pytest.mark.slow
def test_a_429_the_runner_sees_is_recorded_as_a_rejected_window(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = route_generic(
        tmp_path, "evt-w-429", auth_profile_pool="acctA,acctB,acctC", created=True
    ).run
    first = steps_of(run)["worker"].account_profile
    agent.configure(profiles={first: {"rate_limit": "HTTP 429 Too Many Requests"}})
    run_workflow_run(run.id)
    row = AccountWindow.objects.get(account_profile=first)
    assert (row.window, row.status, row.source) == (
        "rate_limit",
        "rejected",
        "429 seen by the runner",
    )
    assert row.resets_at is not None and row.resets_at > timezone.now()
    assert row.step_run_id is not None


def test_a_paced_account_waits_for_its_pace_and_a_paced_pool_defers(
    tmp_path: Path,
) -> None:
    # 5 h windows resetting in 60 min: 80 % elapsed; 85 % used is ahead of the pace.
    for name in ("acctA", "acctB"):
        Account.objects.create(name=name, provider="codewith", window_pace=True)
        spend(name, 0.85, minutes=60)
    result = route_generic(tmp_path, "evt-pace", auth_profile_pool="acctA,acctB")
    assert result.run is None and result.reason_code == reasons.WINDOW_PACED
    services.account_edit(name="acctB", window_pace=False)
    result = route_generic(tmp_path, "evt-pace-2", auth_profile_pool="acctA,acctB")
    assert result.run is not None
    # The worker takes the one unpaced account; the verifier never shares it (worker ≠
    # verifier): it is planned on the paced one and waits for its pace when it starts.
    assert (result.account_profiles or {}) == {"worker": "acctB", "verifier": "acctA"}


def test_a_steps_spend_is_read_from_the_observations_of_step_runs() -> None:
    spent_by_steps("acctA", 0.1, 0.3, 0.62)
    spend("acctB", 0.5)  # not observed by a step run
    state = window_state(["acctA", "acctB"])
    (a,) = state["acctA"]
    assert (a.used, a.spend) == (0.62, pytest.approx(0.32))
    (b,) = state["acctB"]
    assert (b.used, b.spend) == (0.5, None)


def test_admission_drops_an_account_predicted_to_run_out_with_its_load(
    tmp_path: Path,
) -> None:
    pool = "acctA,acctB"
    for name in ("acctA", "acctB"):
        spent_by_steps(name, 0.32, 0.64)  # 32 % a step: one more fits, two do not
    first = route_generic(tmp_path, "evt-p1", auth_profile_pool=pool, max_per_profile=0)
    assert first.run is not None
    loaded = steps_of(first.run)["worker"].account_profile  # its reservation
    other = ({"acctA", "acctB"} - {loaded}).pop()
    plan = route_generic(
        tmp_path, "evt-p2", auth_profile_pool=pool, max_per_profile=0, dry_run=True
    )
    # The worker goes where the load fits; the verifier never shares its account.
    assert (plan.account_profiles or {}) == {"worker": other, "verifier": loaded}
    second = route_generic(
        tmp_path, "evt-p2", auth_profile_pool=pool, max_per_profile=0
    )
    assert second.run is not None
    assert (second.account_profiles or {}) == {"worker": other, "verifier": loaded}
    # Both carry a step now: a third would take either past 100 %.
    third = route_generic(tmp_path, "evt-p3", auth_profile_pool=pool, max_per_profile=0)
    assert third.run is None
    assert third.reason_code == reasons.WINDOW_EXHAUSTED
    assert "acctA: 5h 64% (32%/step)" in (third.reason or "")
    deferral = WorkItemDeferral.objects.get(work_item=third.work_item)
    spends = {
        name: [w["spend"] for w in seen]
        for name, seen in deferral.counts_json["windows"].items()
    }
    assert spends == {"acctA": [pytest.approx(0.32)], "acctB": [pytest.approx(0.32)]}


def test_a_step_start_refuses_an_account_predicted_to_run_out() -> None:
    spent_by_steps("acctA", 0.32, 0.64)
    spec: dict[str, Any] = {"routing": {"maxWindowUsed": 0.9}}
    assert window_refusal("acctA", spec, timezone.now(), running=0) is None
    refused = window_refusal("acctA", spec, timezone.now(), running=1)
    assert refused is not None
    code, reason, until = refused
    assert code == reasons.WINDOW_EXHAUSTED and "(32%/step)" in reason
    assert until is not None and until > timezone.now()


# A codex step as the runner sees it: its thread id on stdout, then a model call's answer in
# the rollout file while stdout stays quiet (the final answer is still streaming). Each
# stage waits for the runner's doing, never for a length of time.
_QUIET_CODEX = """
import json, os, sys, time
home, go, release, deadline = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
print(json.dumps({"type": "thread.started", "thread_id": "t-quiet"}), flush=True)
def wait(path):
    end = time.monotonic() + deadline
    while not os.path.exists(path):
        if time.monotonic() > end:
            sys.exit(3)
        time.sleep(0.05)
wait(go)
day = os.path.join(home, "sessions", "2026", "12", "05")
os.makedirs(day)
payload = {"type": "token_count", "rate_limits": {
    "primary": {"used_percent": 93.0, "window_minutes": 300, "resets_at": 1796312755}}}
with open(os.path.join(day, "rollout-x-t-quiet.jsonl"), "w") as f:
    f.write(json.dumps({"type": "event_msg", "payload": payload}) + "\\n")
wait(release)
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_codex_window_is_recorded_while_its_output_is_quiet(tmp_path: Path) -> None:
    """The rollout changes while stdout does not: the runner still reads it while the step
    runs, not only when it ends (the CI failure of test_windows_real on a busy machine)."""
    step = make_step_run(status="running", account_profile="acct-q")
    home, go, release = tmp_path / "codex", tmp_path / "go", tmp_path / "release"
    home.mkdir()

    # The runner's lease renewal, called while the step runs: the test's eyes on the ledger.
    def keep_alive() -> bool:
        step.refresh_from_db(fields=["stdout"])
        if step.stdout:  # the thread id was flushed: now the rollout may change
            go.touch()
        if AccountWindow.objects.filter(account_profile="acct-q").exists():
            release.touch()
        return True

    watch = StepWatch(
        step.id, "codex", is_agent=True, account="acct-q", keep_alive=keep_alive
    )
    argv = [sys.executable, "-c", _QUIET_CODEX, str(home), str(go), str(release)]
    result = watch.run(
        invocation=Invocation(
            argv=[*argv, str(hang_deadline(120))],
            cwd=str(tmp_path),
            env={**os.environ, "CODEX_HOME": str(home)},
            provider="codex",
        ),
        limits=Limits(
            tail_bytes=1 << 16, grace_seconds=1, keep_alive_every=0.1, output_every=0.2
        ),
    )
    assert result.exit_code == 0, "the window was not recorded while the step ran"
    row = AccountWindow.objects.get(account_profile="acct-q", window="5h")
    assert row.used == pytest.approx(0.93) and row.source == SOURCE_CODEX
