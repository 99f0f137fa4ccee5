"""The workflow runner: executes one admitted run as real processes.

`run_workflow_run(run_id)` is what the django-q2 task and `manage.py run_workflow` call:

1. **Claim** the `queued` run (conditional update; a second delivery returns "not-claimed").
2. **Order** the steps by `dependsOn`, ties by sequence (domain.steps). An unknown dependency
   or a cycle fails the run before anything starts.
3. **Isolation**, before the first step: a run whose agent steps ask for a worktree
   (`worktreeMode` auto on a git work tree, or required) gets its own `git worktree` on a
   new branch (runs.worktrees), recorded on the run before it is made; every step works
   there. `required` on a project that is no longer a git work tree, a project outside
   LOOPSWEB_PROJECT_ROOTS, or a worktree git cannot make fails the run before any step.
   The worktree is removed when the run succeeds and kept (then pruned) when it does not.
3b. **Per step**: started under the admission lock with an account re-check, by the transaction
   that finished the step before it (`step_complete`: one transaction per step boundary), or
   for the first step, and one whose account was not free then, by `step_start`. While the
   step's account is at its `maxPerProfile` cap or cooling down: as a django-q2 task, park
   the run and hand its task back to the queue with a delay (the worker is free meanwhile;
   the next delivery resumes after the steps already done, in the worktree the run already
   has); inline (`manage.py run_workflow`), wait and retry, renewing the lease. An agent
   step's directory is checked against the project roots again (a root may be gone since
   admission) and a generated step passes the sandbox preflight again, against the worktree
   the run actually has.
4. **Run the process** outside any transaction (runs.processes): `Popen(argv,
   start_new_session=True)`, so the step and everything it spawns is one process group.
   Keep bounded stdout/stderr tails, enforce `timeoutMs` and `idleTimeoutMs` by killing the
   group (SIGTERM, then SIGKILL after LOOPSWEB_KILL_GRACE_SECONDS), renew the run lease
   about three times per lease.
5. **Record the step** (exit code, pid, duration, tails, and the token usage its agent
   printed in machine-readable output, agents.usage). An agent step that reports a provider
   rate limit puts its account in cooldown, a refused login marks it `login failed`, a hang
   (no progress for the idle limit) marks it `unresponsive`; when its run was admitted with
   a pool and another member is free, the step moves there and runs again (at most
   LOOPSWEB_RATE_LIMIT_MOVES times, ledger/services/failover.py, "an account's failure moves
   the step"): an account's failure fails the run only when no other account of the pool is
   left. A failed or timed-out step ends the run: the remaining steps are skipped (runs are
   sequential and fail fast) and the run is `failed` / `timed_out`; all steps succeeded →
   `succeeded`. The last step's record and the run's end are one transaction, as are a
   step's record and the next step's start. When a step's process exits, anything it left
   running in its group is killed.
6. **A lost lease.** If the lease is lost (the run was cancelled, or recovered after a
   stall), the process group is killed and nothing more is written.
7. **A database error that passes** (ledger.dberrors: a full disk, a read-only or locked
   database, a lost connection) never fails the run: each ledger write is tried again, with
   a growing pause, for up to one lease (LOOPSWEB_RUN_LEASE_SECONDS), and the run goes on
   where it was once the database takes it. When the database stays away longer, the
   runner stops with `database-unavailable` and writes nothing more: the run is left as it
   was, and its expired lease is recovered like that of any worker that went away.

Where each part lives: the step start, the wait for an account and the park
(runs.step_start); one step as a process and what it says about its account
(runs.step_process); the run's worktree, its commits and delivery (runs.run_worktree);
how the execution stops early (runs.run_signals).

Nothing here holds a transaction across a process or a sleep: on SQLite every transaction
holds the database write lock, and admissions must not wait on an agent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from domain.errors import ValidationError
from domain.steps import PlanError, execution_order
from ledger import services
from ledger.dberrors import (
    connection_lost,
    drop_connection,
    error_passes,
    first_line,
    write_ledger,
)
from ledger.hosts import project_check_here, run_target, serve_here
from ledger.models import RunStatus, StepStatus, WorkflowRun, WorkflowStepRun
from ledger.queue import enqueue_run, hand_back_elsewhere, hand_back_run
from ledger.services.failover import RATE_LIMIT_CODE
from ledger.services.retries import TRY_LATER_EXIT_CODE
from runs.agent_step import (
    StepWatch,
    task_deadline,
)
from runs.revision_run import (
    revision_start_branch,
    revision_worker_prompt,
    run_revision,
)
from runs.run_signals import HandedBack, LeaseLost, PoolWaitOver
from runs.run_worktree import RunWorktree, WorktreeLeaseLost
from runs.step_process import StepProcess
from runs.step_start import HandBack, StepStarter
from runs.worktrees import Worktree, WorktreeError

logger = logging.getLogger(__name__)
T = TypeVar("T")

NOT_CLAIMED = "not-claimed"
NOT_DUE = "not-due"
LOST = "lease-lost"
HANDED_BACK = "handed-back"
DB_UNAVAILABLE = "database-unavailable"

SKIP_AFTER_FAILURE = "not run: step {step_id} {status}"
RUN_STEP_FAILED = "step {step_id} {status}: {error}"
RUN_STEP_TRY_LATER = "step {step_id}: the agent asked to try later (exit 75)"
RUN_FAILED_BEFORE_START = "workflow cannot run: {error}"
RUNNER_CRASHED = "runner error: {error}"
RUNNER_STOPPED = "runner stopped before the run finished"
# Per-minute limits a step waits out on its account in a row before it moves
# (ledger/services/failover.py, "a per-minute limit pauses").
PAUSES_IN_A_ROW = 3
NO_ACCOUNT_LEFT = "; no other account of the run's pool is left to move it to"
RUN_LEFT_AS_IT_WAS = (
    "run {run_id} stopped: the database did not take its writes for {seconds} s ({error});"
    " the run is left as it was, and its lease is recovered once it expires"
)


# --- the run ----------------------------------------------------------------------------------


class _RunExecution:
    def __init__(
        self,
        run: WorkflowRun,
        worker: str,
        hand_back: HandBack | None = None,
        deadline: float | None = None,
    ) -> None:
        self.run = run
        self.worker = worker
        lease = float(settings.LOOPSWEB_RUN_LEASE_SECONDS)
        # Three renewals per lease: one slow write (SQLite busy wait) cannot lose the lease.
        self.keep_alive_every = max(0.05, lease / 3)
        self.work = RunWorktree(run, worker)
        self.starter = StepStarter(
            run, worker, hand_back, self.keep_alive, self.keep_alive_every
        )
        self.process = StepProcess(
            run,
            lambda: self.work.worktree,
            self.keep_alive,
            self.keep_alive_every,
            deadline,
        )

    # Renewal: any False is final; a database hiccup is not (the lease may still hold, and
    # if it does not, recovery cleans up).
    def keep_alive(self) -> bool:
        try:
            return services.run_lease_renew(run_id=self.run.id, worker=self.worker)
        except DatabaseError as exc:
            logger.warning(
                "lease renewal of run %s failed: %s", self.run.id, first_line(exc)
            )
            if connection_lost(exc):
                drop_connection()  # the next write opens a new one
            return True

    def execute(self) -> str:
        steps = list(
            WorkflowStepRun.objects.filter(workflow_run_id=self.run.id).order_by(
                "sequence"
            )
        )
        specs = {
            str(spec.get("id")): spec
            for spec in services.steps_from_spec(self.run.workflow.steps_json)
        }
        by_id = {step.step_id: step for step in steps}
        try:
            order = execution_order([(s.step_id, s.sequence) for s in steps], specs)
            self._revision_bind()
            self._prepare_worktree(list(specs.values()))
        except (PlanError, ValidationError, WorktreeError) as exc:
            return self._finalize(
                RunStatus.FAILED, RUN_FAILED_BEFORE_START.format(error=exc)
            )
        todo = [by_id[s] for s in order if by_id[s].status != StepStatus.SUCCEEDED]
        # A step is started by the transaction that finished the one before it (one
        # transaction per step boundary); only the first step, or one whose account was not
        # free then, is started on its own (waiting, or handing the run back, meanwhile).
        start: services.StepStart | None = None
        for index, step in enumerate(todo):
            rest = todo[index + 1 :]
            try:
                if start is None:
                    start = self.starter.wait(step)
                result, recorded = self._run_step_with_moves(start, specs[step.step_id])
                self.work.commit_step(step)  # its work under its own name
            except PoolWaitOver as over:
                self.save_work(step.step_id)
                self._complete(step, None, end=self._pool_wait_end(step, str(over)))
                return RunStatus.FAILED
            if result.status == StepStatus.SUCCEEDED and rest:
                start = self._complete(step, result, start_next=rest[0].id)
                if start is not None and not start.started:
                    start = None
                continue
            end = self._run_end(step, result, rest)
            self.save_work(step.step_id)
            self._complete(step, None if recorded else result, end=end)
            self.work.ended(end.status, self.process.verdict)  # delivery, then removal
            return end.status
        return self._finalize(RunStatus.SUCCEEDED, None)

    @staticmethod
    def _pool_wait_end(step: WorkflowStepRun, reason: str) -> services.RunEnd:
        return services.RunEnd(
            status=RunStatus.FAILED,
            error=RUN_STEP_FAILED.format(
                step_id=step.step_id, status=StepStatus.FAILED, error=reason
            ),
            skip_reason=SKIP_AFTER_FAILURE.format(
                step_id=step.step_id, status=StepStatus.FAILED
            ),
        )

    @staticmethod
    def _run_end(
        step: WorkflowStepRun,
        result: services.StepResult,
        rest: Sequence[WorkflowStepRun],
    ) -> services.RunEnd:
        """How the run ends after `step`: succeeded when it was the last and succeeded;
        else failed (timed_out when the step timed out), the steps after it skipped. A
        step that exited 75 asked to try later: its run's end says so, and the cascade runs
        it again (ledger.services.retries)."""
        if result.status == StepStatus.SUCCEEDED and not rest:
            return services.RunEnd(status=RunStatus.SUCCEEDED)
        status = result.status
        error = RUN_STEP_FAILED.format(
            step_id=step.step_id, status=status, error=result.error or status
        )
        if status == StepStatus.FAILED and result.exit_code == TRY_LATER_EXIT_CODE:
            error = RUN_STEP_TRY_LATER.format(step_id=step.step_id)
        return services.RunEnd(
            status=RunStatus.TIMED_OUT
            if status == StepStatus.TIMED_OUT
            else RunStatus.FAILED,
            error=error,
            skip_reason=SKIP_AFTER_FAILURE.format(step_id=step.step_id, status=status),
        )

    def _complete(
        self,
        step: WorkflowStepRun,
        result: services.StepResult | None,
        *,
        start_next: str | None = None,
        end: services.RunEnd | None = None,
    ) -> services.StepStart | None:
        try:
            return write_ledger(
                f"run {self.run.id}: the end of step {step.step_id}",
                lambda: services.step_complete(
                    step_run_id=step.id,
                    worker=self.worker,
                    result=result,
                    start_next=start_next,
                    end=end,
                ),
            )
        except services.LedgerError:
            if result is not None:
                # The run was ended meanwhile (a cancel killed the step): keep what the step
                # printed on its row all the same.
                StepWatch(step.id, None, is_agent=False).keep(
                    result.stdout or "", result.stderr or ""
                )
            raise LeaseLost() from None

    def _finalize(self, status: str, error: str | None) -> str:
        self.save_work(None)
        try:
            write_ledger(
                f"run {self.run.id}: its end ({status})",
                lambda: services.run_finalize(
                    run_id=self.run.id, status=status, error=error
                ),
            )
        except services.LedgerError:
            raise LeaseLost() from None
        self.work.ended(status, self.process.verdict)
        return status

    def _revision_bind(self) -> None:
        """The revision round this run carries out, if any (runs.revision_run): its
        worktree starts from the branch it continues, its worker is told the findings."""
        revision = write_ledger(
            f"run {self.run.id}: its revision", lambda: run_revision(self.run)
        )
        if revision is not None:
            self.work.start_from = revision_start_branch(revision)
            self.process.worker_extra = revision_worker_prompt(self.run, revision)

    def _prepare_worktree(self, specs: list[Mapping[str, Any]]) -> Worktree | None:
        """The run's own worktree when its agent steps ask for one (module docstring,
        "isolation")."""
        try:
            return self.work.prepare(specs)
        except WorktreeLeaseLost:
            raise LeaseLost() from None

    @property
    def worktree(self) -> Worktree | None:
        return self.work.worktree

    def save_work(self, step_id: str | None) -> None:
        """Commit what the agents left on the run's branch (runs.run_worktree)."""
        self.work.save(step_id)

    def _run_step_with_moves(
        self, start: services.StepStart, spec: Mapping[str, Any]
    ) -> tuple[services.StepResult, bool]:
        """Run a started step; when its account failed it (a rate limit, a refused login, a
        hang: `StepProcess.account_failure`) and another member of the run's pool is free,
        record the attempt, move the step there and try again, up to
        LOOPSWEB_RATE_LIMIT_MOVES moves (ledger/services/failover.py, "an account's failure
        moves the step"); pinned steps never move. A per-minute limit waits on its account
        instead (`StepStarter.pause`), PAUSES_IN_A_ROW times since the last move
        (`step_pauses`: across hand-backs; failover's "a per-minute limit pauses"). A task
        whose second account reported a rate limit is held (ledger.claims); a login, it
        ends. When no member is free: after a rate limit, while every member cools, the step
        waits for the earliest cooldown (parked: failover's "a whole-pool limit waits"), a
        wait that is over raises `PoolWaitOver`; after a login or a hang it waits only when
        a member is left (`pool_member_left`), else the run ends with `NO_ACCOUNT_LEFT`.
        Returns the last result and whether it is recorded already; otherwise the caller
        records it."""
        moves = 0
        while True:
            result = self.process.execute(start, spec)
            failure = self.process.account_failure
            # Bounded trust (ledger.claims): a second account of this task reported the
            # same, so the task parks instead of moving on: after a rate limit it holds
            # (the next start waits, the run parked, then it runs again); after a failed
            # login its run ends, not retried.
            if self.process.parked and result.status != StepStatus.SUCCEEDED:
                result = parked_result(result, self.process.parked)
                if not self.process.held:
                    return result, False
                self._complete(start.step_run, result)
                start = self.starter.wait(start.step_run)
                moves = 0
                continue
            step = start.step_run
            paused = self.process.paused_until
            if (
                failure is not None
                and paused is not None
                and services.step_pauses(run_id=self.run.id, step_id=step.step_id)
                < PAUSES_IN_A_ROW
            ):
                # A per-minute limit (ledger/services/failover.py, "a per-minute limit
                # pauses"): stay on the account, after it.
                self._complete(step, result)
                start = self.starter.pause(step, paused)
                continue
            if failure is None or moves >= int(settings.LOOPSWEB_RATE_LIMIT_MOVES):
                return result, False
            self._complete(step, result)
            moved = write_ledger(
                f"run {self.run.id}: the move of step {step.step_id}",
                partial(
                    services.step_move_after_failure,
                    step_run_id=step.id,
                    code=failure.code,
                    reason=failure.reason,
                ),
            )
            if moved is None:
                if services.run_pool(self.run) is None:
                    return result, True
                if failure.code != RATE_LIMIT_CODE and not services.pool_member_left(
                    self.run, step, timezone.now()
                ):
                    error = (result.error or result.status) + NO_ACCOUNT_LEFT
                    return replace(result, error=error), True
                # Every member is busy or cooling: wait for one (parked), then go on.
                start = self.starter.wait(step)
                moves = 0
                continue
            moves += 1
            logger.info(
                "run %s step %s failed on its account (%s); trying again on %s",
                self.run.id,
                step.step_id,
                failure.code,
                moved,
            )
            start = self.starter.wait(step)


def parked_result(result: services.StepResult, reason: str) -> services.StepResult:
    """A parked attempt's result: the task's reason first, then what the step said."""
    said = f" ({result.error})" if result.error else ""
    return replace(result, error=f"{reason}{said}")


def run_workflow_run(run_id: str, *, hand_back: HandBack | None = None) -> str:
    """Claim and execute one queued run; returns its final status.

    Returns `not-due` for a retry whose backoff has not ended (nothing written),
    `not-claimed` when the run was not queued (a second delivery, a cancelled run),
    `lease-lost` when it was taken away mid-way (cancelled or recovered),
    `database-unavailable` when a write failed for a whole lease (module docstring, "a
    database error that passes"); none writes anything further. Any other error fails the
    run (best effort) and re-raises.

    With `hand_back` (the django-q2 task), a step that must wait for its account does not
    wait here: the run is parked and its task enqueued again with a delay (`handed-back`),
    and the next delivery resumes a parked run where it stopped. Without it (`manage.py
    run_workflow`), the runner waits in this process, renewing the lease.
    """
    started = time.monotonic()
    worker = services.worker_identity()
    try:
        run = write_ledger(
            f"run {run_id}: its claim",
            lambda: services.run_claim(run_id=run_id, worker=worker),
        )
        if run is None and (
            WorkflowRun.objects.filter(
                pk=run_id, status=RunStatus.QUEUED, scheduled_for__gt=timezone.now()
            ).exists()
        ):
            logger.info(
                "workflow run %s not claimed (its retry backoff has not ended)", run_id
            )
            return NOT_DUE
        if run is None and hand_back is not None:
            run = write_ledger(
                f"run {run_id}: its resumption",
                lambda: services.run_resume(run_id=run_id, worker=worker),
            )
    except DatabaseError as exc:
        if not error_passes(exc):
            raise
        # Not claimed: the run is still queued, and recovery hands it out again.
        _left_as_it_was(run_id, exc)
        return DB_UNAVAILABLE
    if run is None:
        logger.info("workflow run %s not claimed (not queued)", run_id)
        return NOT_CLAIMED
    # The django-q2 task is killed at Q_TIMEOUT: stop the step shortly before, so the run
    # says why it ended, keeps its output and commits its work (runs.agent_step).
    deadline = task_deadline(started) if hand_back is not None else None
    execution = _RunExecution(run, worker, hand_back, deadline)
    try:
        return execution.execute()
    except HandedBack:
        logger.debug("workflow run %s handed back to the queue", run_id)
        return HANDED_BACK
    except LeaseLost:
        execution.save_work(None)
        current = (
            WorkflowRun.objects.filter(pk=run_id)
            .values_list("status", flat=True)
            .first()
        )
        logger.warning(
            "workflow run %s was taken from this worker (now %s)", run_id, current
        )
        return LOST
    except DatabaseError as exc:
        if not error_passes(exc):
            _fail_stopped_run(execution, exc)
            raise
        # The database stayed away for a whole lease: nothing more can be written now.
        execution.save_work(None)
        _left_as_it_was(run_id, exc)
        return DB_UNAVAILABLE
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        _fail_stopped_run(execution, exc)
        raise


def _left_as_it_was(run_id: str, exc: BaseException) -> None:
    logger.error(
        RUN_LEFT_AS_IT_WAS.format(
            run_id=run_id,
            seconds=settings.LOOPSWEB_RUN_LEASE_SECONDS,
            error=first_line(exc),
        )
    )


def _fail_stopped_run(execution: _RunExecution, exc: BaseException) -> None:
    """Fail a run whose runner stopped: a bug, a database error that does not pass, or the
    worker being stopped (SIGTERM/SIGINT in `manage.py run_workflow`). The step's process
    group is already gone (run_process kills it on the way out), so the run is failed now
    rather than when its lease expires."""
    run_id = execution.run.id
    logger.exception("workflow run %s stopped unexpectedly", run_id)
    execution.save_work(None)
    error = (
        RUNNER_STOPPED
        if isinstance(exc, KeyboardInterrupt | SystemExit)
        else RUNNER_CRASHED.format(error=exc)
    )
    try:
        services.run_finalize(run_id=run_id, status=RunStatus.FAILED, error=error)
    except Exception:
        logger.exception("could not fail workflow run %s; recovery will", run_id)


def run_delivered(run_id: str, *, inline: bool = False) -> str:
    """A run's task, delivered to this host's run cluster: run it here, or hand it back.

    1. Several machines: a run this host cannot serve (its project not here, no binary for
       its provider) goes back to the queue of one that can, never failed here
       (`handed-back`). A run this host serves records that the host has its project.
    2. `inline` (django-q2's sync mode, debugging): a hand-back would recurse, so a step
       that waits for its account waits in this process, and a run that cannot be served
       here runs here anyway.
    3. A run delivered before its retry backoff ended (`not-due`) is queued again for its
       due time.
    """
    target = run_target(run_id)
    why = serve_here(target) if target is not None else None
    if why is not None and not inline:
        logger.info("run %s handed back: %s", run_id, why)
        hand_back_elsewhere(run_id, target.project if target is not None else None)
        return HANDED_BACK
    if target is not None and target.project is not None:
        project_check_here(target.project, has=True)  # recorded once
    result = run_workflow_run(run_id, hand_back=None if inline else hand_back_run)
    if result == NOT_DUE:
        due = (
            WorkflowRun.objects.filter(pk=run_id)
            .values_list("scheduled_for", flat=True)
            .first()
        )
        if due is not None:
            enqueue_run(run_id, due)
    return result
