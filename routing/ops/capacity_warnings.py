"""What /ops/ says about run capacity: run workers busy / total per cluster, runs waiting too
long, and the warnings an operator must act on (each names the setting or process to change).

Warnings:
1. no run cluster is running (admitted runs wait in the queue);
2. the caps of the scheduled drains allow more active runs than there are run workers
   (LOOPSWEB_RUN_WORKERS): the worker count, not the caps, would decide how many agents run;
3. a schedule (a drain, lease recovery) is overdue: the main cluster is not running or is
   stuck;
4. runs have waited more than two minutes for a run worker;
5. inbox events are pending or held and no (unpaused) drain schedule will pick them up: the
   warning names the `schedule_drain` command to run (`unscheduled_warning`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from ledger.capacity import WAITING_TOO_LONG, RunCapacity, run_capacity
from routing.drains.configs import DrainConfig, ScheduledDrain
from routing.ops.selectors import OverdueSchedule

RUN_CLUSTER_COMMAND = "Q_CLUSTER_NAME=loopsweb-runs python manage.py qcluster"

NO_RUN_CLUSTER = (
    "No run cluster is running: admitted runs wait in the queue until one starts "
    f"(`{RUN_CLUSTER_COMMAND}`; `make run` starts one)."
)
CAPS_OVER_WORKERS = (
    "The scheduled drains allow up to {allowed} active runs ({parts}) but there are "
    "{workers} run workers (LOOPSWEB_RUN_WORKERS{where}): runs beyond {workers} wait for a "
    "worker, not for a cap. Raise LOOPSWEB_RUN_WORKERS, add a run cluster, or lower --max-active."
)
UNCAPPED_DRAIN = (
    "Scheduled drain {name} has no --max-active: it may admit more runs than the {workers} "
    "run workers (LOOPSWEB_RUN_WORKERS{where}), and then the worker count decides, not the caps."
)
SCHEDULE_OVERDUE = (
    "Schedule {name} is overdue by {late} (due {due:%Y-%m-%d %H:%M:%S} UTC): is the main "
    "cluster (`python manage.py qcluster`) running?"
)
RUNS_WAITING = (
    "{n} run(s) have waited more than {minutes} minutes for a run worker (oldest admitted "
    "{oldest:%Y-%m-%d %H:%M:%S} UTC): all run workers are busy or no run cluster takes them."
)


UNSCHEDULED = (
    "{what} and no drain schedule will pick {them} up: schedule a drain with "
    "`python manage.py schedule_drain {name} {kind} --every 5m` "
    "(or route {them} once with `python manage.py drain {kind}`){which}."
)
ANY_KIND = "KIND"
WHICH_KIND = "; KIND is todos-task for task.* events, generic for the others"


def unscheduled_warning(
    *,
    pending: int,
    deferred: int,
    schedules: Sequence[ScheduledDrain],
    kind: str | None,
) -> str | None:
    """The warning for inbox events that wait with no schedule to drain them, or None
    (no such events, or a drain schedule that is not paused exists). `kind` is the route
    kind the page knows the installation drains (None: no drain ever ran)."""
    if not (pending or deferred) or any(not s.paused for s in schedules):
        return None
    parts = []
    if pending:
        parts.append(f"{pending} pending")
    if deferred:
        parts.append(f"{deferred} held (deferred)")
    n = pending + deferred
    what = f"{' and '.join(parts)} inbox event{' waits' if n == 1 else 's wait'}"
    return UNSCHEDULED.format(
        what=what,
        them="it" if n == 1 else "them",
        name=f"{kind}-drain" if kind else "inbox-drain",
        kind=kind or ANY_KIND,
        which="" if kind else WHICH_KIND,
    )


@dataclass(frozen=True)
class CapacityView:
    capacity: RunCapacity
    workers: int  # live run workers, or this machine's LOOPSWEB_RUN_WORKERS when none
    allowed: (
        int | None
    )  # sum of the scheduled drains' --max-active (None: one is uncapped)
    warnings: list[str] = field(default_factory=list)
    scheduled: int = 0  # drain schedules (their caps are what `allowed` sums)


def _late(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def capacity_view(
    configs: Sequence[DrainConfig],
    *,
    now: datetime,
    overdue: Sequence[OverdueSchedule],
    unscheduled: str | None = None,
) -> CapacityView:
    """Capacity and warnings for the overview. Three queries (run_capacity's); `overdue`
    is the page's own read of the overdue schedules (selectors.overdue_schedules),
    `unscheduled` the page's `unscheduled_warning` (from reads it already made)."""
    capacity = run_capacity(now=now)
    warnings: list[str] = []
    live = capacity.workers
    workers = live or int(settings.LOOPSWEB_RUN_WORKERS)
    where = "" if live else " on this machine"
    if not live:
        warnings.append(NO_RUN_CLUSTER)

    # The strictest --max-active of each scope among the scheduled drains, summed.
    per_scope: dict[str, int | None] = {}
    uncapped: list[str] = []
    for config in configs:
        if config.origin != "schedule":
            continue
        if config.max_active is None:
            uncapped.append(config.label)
            continue
        current = per_scope.get(config.scope)
        per_scope[config.scope] = (
            config.max_active if current is None else min(current, config.max_active)
        )
    allowed = None if uncapped else sum(v or 0 for v in per_scope.values())
    for name in uncapped:
        warnings.append(UNCAPPED_DRAIN.format(name=name, workers=workers, where=where))
    if allowed is not None and allowed > workers:
        parts = ", ".join(f"{scope} {cap}" for scope, cap in sorted(per_scope.items()))
        warnings.append(
            CAPS_OVER_WORKERS.format(
                allowed=allowed, parts=parts, workers=workers, where=where
            )
        )

    for schedule in overdue:
        due = schedule.next_run
        warnings.append(
            SCHEDULE_OVERDUE.format(name=schedule.name, late=_late(now - due), due=due)
        )

    if unscheduled:
        warnings.append(unscheduled)

    if capacity.waiting and capacity.oldest_waiting is not None:
        warnings.append(
            RUNS_WAITING.format(
                n=capacity.waiting,
                minutes=int(WAITING_TOO_LONG.total_seconds() // 60),
                oldest=capacity.oldest_waiting,
            )
        )
    return CapacityView(
        capacity=capacity,
        workers=workers,
        allowed=allowed,
        warnings=warnings,
        scheduled=sum(1 for c in configs if c.origin == "schedule"),
    )
