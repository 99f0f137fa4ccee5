"""Worker ≠ verifier, always (issue 58, 9): no step of a run lands on an account the run's
other role started on, at admission (domain.pool contract 8), at step start and at failover
(ledger.services.failover rule 3); when the only free account is the worker's, the verifier
waits as a whole-pool cooldown does (rule 5), and ends the run when no other account could
ever take it. In-process, on the real services and a real database; the last test is a
property test over interleaved admissions, starts, finishes, rate limits and cooldowns of
many runs sharing pools."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ledger import services
from ledger.models import (
    AccountCooldown,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
)
from ledger.services.account_loads import account_load_drift
from tests.ledger.runner_helpers import cool_account as _cool
from tests.ledger.runner_helpers import route_generic, steps_of

pytestmark = pytest.mark.django_db

NOT_STARTED = (StepStatus.PENDING, StepStatus.SKIPPED)


def _run_of_two(tmp_path: Path) -> tuple[WorkflowRun, str, str]:
    run = route_generic(tmp_path, auth_profile_pool="acctA,acctB", created=True).run
    steps = steps_of(run)
    worker, verifier = (
        steps["worker"].account_profile,
        steps["verifier"].account_profile,
    )
    assert worker and verifier and worker != verifier
    assert services.run_claim(run_id=run.id, worker="w") is not None
    return run, worker, verifier


def _worker_moves_onto_the_verifier_s_account(run: WorkflowRun, worker: str) -> str:
    """The worker's account cools: the worker moves to the only other member (the one the
    verifier was planned on) and succeeds there; returns that account."""
    _cool(worker)
    step = steps_of(run)["worker"]
    started = services.step_start(step_run_id=step.id, worker="w")
    assert started.started and started.step_run.account_profile != worker
    services.step_complete(
        step_run_id=step.id,
        worker="w",
        result=services.StepResult(status=StepStatus.SUCCEEDED),
    )
    return str(started.step_run.account_profile)


def test_the_verifier_waits_for_the_cooling_account_not_the_worker_s(
    tmp_path: Path,
) -> None:
    run, worker, _ = _run_of_two(tmp_path)
    took = _worker_moves_onto_the_verifier_s_account(run, worker)
    verifier = steps_of(run)["verifier"]
    assert verifier.account_profile == took  # planned there at admission

    waits = services.step_start(step_run_id=verifier.id, worker="w")

    # Refused on the worker's account, nowhere to move: a whole-pool wait for `worker`.
    assert not waits.started and waits.wait_code == "pool_rate_limited"
    until = AccountCooldown.objects.get(pk=worker).until
    assert waits.retry_at == until
    assert waits.wait_reason == (
        "every other account of the pool is busy or rate limited until "
        f"{timezone.localtime(until):%H:%M} (worker ≠ verifier)"
    )
    assert steps_of(run)["verifier"].status == StepStatus.PENDING

    # Its cooldown over, the verifier moves to it and starts there.
    AccountCooldown.objects.filter(pk=worker).delete()
    started = services.step_start(step_run_id=verifier.id, worker="w")
    assert started.started and started.step_run.account_profile == worker
    assert account_load_drift() == []


def test_a_verifier_whose_own_account_cools_never_moves_onto_the_worker_s(
    tmp_path: Path,
) -> None:
    run, worker, verifier = _run_of_two(tmp_path)
    step = steps_of(run)["worker"]
    assert services.step_start(step_run_id=step.id, worker="w").started
    services.step_complete(
        step_run_id=step.id,
        worker="w",
        result=services.StepResult(status=StepStatus.SUCCEEDED),
    )
    _cool(verifier)

    waits = services.step_start(step_run_id=steps_of(run)["verifier"].id, worker="w")

    assert waits.wait_code == "pool_rate_limited"
    assert waits.wait_reason and waits.wait_reason.endswith("(worker ≠ verifier)")
    assert steps_of(run)["verifier"].account_profile == verifier


def test_a_verifier_wait_past_the_bound_is_over(tmp_path: Path, settings: Any) -> None:
    settings.LOOPSWEB_POOL_WAIT_SECONDS = 60  # the worker's old account cools 10 min
    run, worker, _ = _run_of_two(tmp_path)
    _worker_moves_onto_the_verifier_s_account(run, worker)

    over = services.step_start(step_run_id=steps_of(run)["verifier"].id, worker="w")

    assert over.wait_code == "pool_wait_over"
    assert over.wait_reason and "(worker ≠ verifier)" in over.wait_reason


def test_no_other_account_that_could_ever_free_ends_the_wait_naming_it(
    tmp_path: Path,
) -> None:
    for name in ("acctA", "acctB"):
        services.account_add(name=name, provider="codewith")
    run, worker, _ = _run_of_two(tmp_path)
    _worker_moves_onto_the_verifier_s_account(run, worker)
    services.account_set_enabled(name=worker, enabled=False)

    over = services.step_start(step_run_id=steps_of(run)["verifier"].id, worker="w")

    assert over.wait_code == "pool_wait_over"
    assert over.wait_reason == (
        f"no account of the pool but {steps_of(run)['worker'].account_profile} "
        "(the run's worker account) can take this step (worker ≠ verifier): "
        f"account {worker}: disabled"
    )


def test_admission_with_one_free_member_plans_the_verifier_on_another(
    tmp_path: Path,
) -> None:
    _cool("acctA")
    run = route_generic(tmp_path, auth_profile_pool="acctA,acctB", created=True).run
    steps = steps_of(run)
    assert steps["worker"].account_profile == "acctB"
    assert steps["verifier"].account_profile == "acctA"

    services.account_add(name="acctC", provider="codewith")
    services.account_add(name="acctD", provider="codewith")
    services.account_set_enabled(name="acctD", enabled=False)
    held = route_generic(tmp_path, auth_profile_pool="acctC,acctD")
    assert held.kind == "throttled" and held.reason_code == "account_disabled"
    assert held.reason == (
        "worker ≠ verifier: no pool member but acctC can take the verifier "
        "(every other member is disabled)"
    )


# --- the property ------------------------------------------------------------------------------

_SEARCH = int(os.environ.get("LOOPSWEB_PROPERTY_SEARCH") or 0)
_EXAMPLES = itertools.count()

# Weighted toward the steps of a few runs: starts, finishes and rate limits come oftener
# than admissions and operator actions, so a run gets through its worker to its verifier.
_STEP = st.integers(0, 2)
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, 3)),
        *[st.tuples(st.just("start"), _STEP)] * 3,
        *[st.tuples(st.just("finish"), _STEP)] * 2,
        st.tuples(st.just("rate_limit"), _STEP),
        st.tuples(st.just("cool"), st.integers(0, 3)),
        st.tuples(st.just("clear"), st.integers(0, 3)),
        st.tuples(st.just("disable"), st.integers(0, 3)),
        st.tuples(st.just("enable"), st.integers(0, 3)),
    ),
    min_size=4,
    max_size=30,
)


class _Scenario:
    """One example: a pool of fresh account names, and the runs admitted on it."""

    def __init__(self, project: Path, size: int, cooling: list[bool]) -> None:
        n = next(_EXAMPLES)
        self.project = project
        self.pool = [f"x{n}m{i}" for i in range(size)]
        for name in self.pool:
            services.account_add(name=name, provider="codewith")
        for name, cool in zip(self.pool, cooling, strict=False):
            if cool:
                _cool(name)
        self.runs: list[WorkflowRun] = []

    def member(self, k: int) -> str:
        return self.pool[k % len(self.pool)]

    def open_steps(self, status: tuple[str, ...]) -> list[WorkflowStepRun]:
        return list(
            WorkflowStepRun.objects.filter(
                workflow_run__in=self.runs,
                workflow_run__status__in=(RunStatus.QUEUED, RunStatus.RUNNING),
                status__in=status,
            ).order_by("workflow_run_id", "sequence")
        )

    def apply(self, kind: str, k: int) -> None:
        if kind == "admit":
            pool = ",".join(self.pool[: 2 + k % (len(self.pool) - 1)])
            result = route_generic(self.project, auth_profile_pool=pool)
            if result.kind == "created":
                self.runs.append(result.run)
                steps = steps_of(result.run)
                # As admitted: two accounts.
                assert steps["worker"].account_profile
                assert (
                    steps["worker"].account_profile != steps["verifier"].account_profile
                )
        elif kind == "start":
            self.start(k)
        elif kind in ("finish", "rate_limit"):
            running = self.open_steps((StepStatus.RUNNING,))
            if running:
                self.end(running[k % len(running)], rate_limited=kind == "rate_limit")
        elif kind == "cool":
            _cool(self.member(k))
        elif kind == "clear":
            services.account_clear(name=self.member(k))
        else:
            services.account_set_enabled(name=self.member(k), enabled=kind == "enable")

    def start(self, k: int) -> None:
        runs = [
            r
            for r in self.runs
            if not WorkflowStepRun.objects.filter(
                workflow_run=r, status=StepStatus.RUNNING
            ).exists()
            and WorkflowRun.objects.get(pk=r.pk).status
            in (RunStatus.QUEUED, RunStatus.RUNNING)
        ]
        if not runs:
            return
        run = runs[k % len(runs)]
        if WorkflowRun.objects.get(pk=run.pk).status == RunStatus.QUEUED:
            assert services.run_claim(run_id=run.id, worker="w") is not None
        step = next(
            s
            for s in WorkflowStepRun.objects.filter(workflow_run=run).order_by(
                "sequence"
            )
            if s.status != StepStatus.SUCCEEDED
        )
        outcome = services.step_start(step_run_id=step.id, worker="w")
        if outcome.wait_code == "pool_wait_over":
            services.step_complete(
                step_run_id=step.id,
                worker="w",
                result=None,
                end=services.RunEnd(status=RunStatus.FAILED, error=outcome.wait_reason),
            )

    def end(self, step: WorkflowStepRun, *, rate_limited: bool) -> None:
        last = not WorkflowStepRun.objects.filter(
            workflow_run_id=step.workflow_run_id, sequence__gt=step.sequence
        ).exists()
        if not rate_limited:
            services.step_complete(
                step_run_id=step.id,
                worker="w",
                result=services.StepResult(status=StepStatus.SUCCEEDED),
                end=services.RunEnd(status=RunStatus.SUCCEEDED) if last else None,
            )
            return
        assert step.account_profile
        _cool(step.account_profile)
        services.step_complete(
            step_run_id=step.id,
            worker="w",
            result=services.StepResult(
                status=StepStatus.FAILED, rate_limited=True, error="HTTP 429"
            ),
        )
        services.step_move_after_failure(step_run_id=step.id, reason="HTTP 429")

    def check(self) -> None:
        """No run has its worker and its verifier on one account: as admitted, as started,
        and no attempt of the verifier on the account the worker did its work on."""
        for run in self.runs:
            steps = steps_of(run)
            worker, verifier = steps["worker"], steps["verifier"]
            if verifier.status not in NOT_STARTED:
                assert worker.account_profile != verifier.account_profile, run.id
            tried = WorkflowStepAttempt.objects.filter(
                workflow_run=run, step_id="verifier"
            ).values_list("account_profile", flat=True)
            assert worker.account_profile not in set(tried), run.id


@settings(
    max_examples=_SEARCH or 40,
    derandomize=not _SEARCH,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    size=st.integers(2, 4),
    cooling=st.lists(st.booleans(), max_size=4),
    events=EVENTS,
)
# The two shapes: the verifier's account cools while the worker runs (one of the
# two members, whichever it is), and the worker's account reports a rate limit and its step
# moves to the verifier's account.
@example(
    size=2,
    cooling=[],
    events=[("admit", 0), ("start", 0), ("finish", 0), ("cool", 0), ("start", 0)],
)
@example(
    size=2,
    cooling=[],
    events=[("admit", 0), ("start", 0), ("finish", 0), ("cool", 1), ("start", 0)],
)
@example(
    size=2,
    cooling=[],
    events=[("admit", 0), ("start", 0), ("rate_limit", 0), ("start", 0)]
    + [("finish", 0), ("start", 0)],
)
def test_no_run_ever_has_its_worker_and_verifier_on_one_account(
    tmp_path: Path, size: int, cooling: list[bool], events: list[tuple[str, int]]
) -> None:
    scenario = _Scenario(tmp_path, size, cooling)
    for kind, k in events:
        scenario.apply(kind, k)
        scenario.check()
    assert account_load_drift() == []
