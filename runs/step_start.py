"""A step's start (runs/runner.py, "per step"): started under the admission lock by
`services.step_start`; while the step's account is at its cap or cooling, the run either
waits here, renewing its lease (`manage.py run_workflow`), or is parked and its task handed
back to the queue with a delay (the django-q2 task), holding no worker meanwhile."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger import services
from ledger.dberrors import write_ledger
from ledger.models import WorkflowRun, WorkflowStepRun
from runs.run_signals import HandedBack, LeaseLost, PoolWaitOver

logger = logging.getLogger(__name__)

# `hand_back(run_id, delay_seconds)`: enqueue the run's task again, due in `delay_seconds`.
# Called inside the transaction that parks the run, so both happen or neither does.
HandBack = Callable[[str, float], None]


class StepStarter:
    """Starts a run's steps for one worker: `wait(step)` returns the step started, or
    raises `HandedBack` (parked), `PoolWaitOver` or `LeaseLost`."""

    def __init__(
        self,
        run: WorkflowRun,
        worker: str,
        hand_back: HandBack | None,
        keep_alive: Callable[[], bool],
        keep_alive_every: float,
    ) -> None:
        self.run = run
        self.worker = worker
        self.hand_back = hand_back
        self.keep_alive = keep_alive
        self.keep_alive_every = keep_alive_every
        self.poll_seconds = float(settings.LOOPSWEB_STEP_START_POLL_SECONDS)

    def wait(self, step: WorkflowStepRun) -> services.StepStart:
        next_renewal = time.monotonic() + self.keep_alive_every
        while True:
            try:
                outcome = write_ledger(
                    f"run {self.run.id}: the start of step {step.step_id}",
                    lambda: services.step_start(
                        step_run_id=step.id, worker=self.worker
                    ),
                )
            except services.LedgerError:
                raise LeaseLost() from None
            if outcome.started:
                return outcome
            if outcome.wait_code == services.POOL_WAIT_OVER_CODE:
                raise PoolWaitOver(outcome.wait_reason)
            # Debug only: the first refusal of each kind is a `step_waiting` event already.
            logger.debug(
                "run %s step %s waits: %s",
                self.run.id,
                step.step_id,
                outcome.wait_reason,
            )
            delay = self.poll_seconds
            if outcome.retry_at is not None:
                until = (outcome.retry_at - timezone.now()).total_seconds()
                delay = max(0.01, min(delay, until))
            if self.hand_back is not None:
                self.park(delay)
            # A refused start renewed the lease; sleep no longer than a renewal interval.
            time.sleep(min(delay, self.keep_alive_every))
            if time.monotonic() >= next_renewal:
                next_renewal = time.monotonic() + self.keep_alive_every
                if not self.keep_alive():
                    raise LeaseLost()

    def pause(self, step: WorkflowStepRun, until: datetime) -> services.StepStart:
        """Wait out the step's account's per-minute limit (ledger/services/failover.py, "a
        per-minute limit pauses"), then start the step again on it: `until` plus up to a
        quarter of the pause more (the stagger: steps paused by one limit do not all start
        at once). Parked meanwhile as a django-q2 task; inline, sleeping and renewing the
        lease."""
        write_ledger(
            f"run {self.run.id}: the pause of step {step.step_id}",
            lambda: services.step_pause(step_run_id=step.id, until=until),
        )
        pause = max(0.0, (until - timezone.now()).total_seconds())
        delay = pause + random.uniform(0, pause / 4)
        if self.hand_back is not None:
            self.park(max(delay, 0.01))
        resume = time.monotonic() + delay
        while (left := resume - time.monotonic()) > 0:
            time.sleep(min(left, self.keep_alive_every))
            if not self.keep_alive():
                raise LeaseLost()
        return self.wait(step)

    def park(self, delay: float) -> None:
        """Free this worker: the run's task comes back in `delay` seconds (see run_park)."""
        assert self.hand_back is not None
        hand_back = self.hand_back
        resume_at = timezone.now() + timedelta(seconds=delay)

        def park() -> bool:
            with transaction.atomic():
                if not services.run_park(
                    run_id=self.run.id, worker=self.worker, resume_at=resume_at
                ):
                    return False
                hand_back(self.run.id, delay)
                return True

        if not write_ledger(f"run {self.run.id}: its hand-back", park):
            raise LeaseLost()
        raise HandedBack()
