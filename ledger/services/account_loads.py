"""Account load kept per account (`workflow_account_loads`), and its recount from the rows.

docs/design.md, "counts come from rows": the counts are changed in the same transactions
that change the rows they count, and a recount from the rows must always agree
(tests/account_loads.py asserts it after every operation of random sequences; `manage.py
recount_account_loads` reports and repairs drift, e.g. after a previous release wrote runs
without keeping the counts).

What one run contributes (`run_load`), the definitions the admission has always used:
  - running: each of its step runs in `running` with an account, on that account (whatever
    the run's status);
  - reserved: a run that is `queued` or `running` and has not started a step (every step run
    still `pending`) reserves its first account-carrying step (lowest `sequence`) on that
    account. Later steps of a started run count only once they run.

A service loads the run's steps (a run has a handful), computes `run_load` before and after
its change and applies the difference with one statement (`apply_load_delta`): an upsert of
relative changes, so concurrent transactions never lose each other's updates, taken in
account order so two of them cannot deadlock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.utils import timezone

from ledger.lock import admission_lock
from ledger.models import (
    AccountLoadCount,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStepRun,
)

_RESERVING_RUN_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)


@dataclass
class LoadDelta:
    """Changes to apply per account (positive or negative)."""

    running: Counter[str] = field(default_factory=Counter)
    reserved: Counter[str] = field(default_factory=Counter)

    def add(self, other: LoadDelta, sign: int = 1) -> None:
        for account, n in other.running.items():
            self.running[account] += sign * n
        for account, n in other.reserved.items():
            self.reserved[account] += sign * n

    def rows(self) -> list[tuple[str, int, int]]:
        """(account, running, reserved) for every account that changes, in account order."""
        accounts = sorted(set(self.running) | set(self.reserved))
        rows = [(a, self.running.get(a, 0), self.reserved.get(a, 0)) for a in accounts]
        return [row for row in rows if row[1] or row[2]]


def run_load(run_status: str | None, steps: Iterable[WorkflowStepRun]) -> LoadDelta:
    """The load one run puts on its accounts (module docstring), from its step runs."""
    steps = list(steps)
    load = LoadDelta()
    for step in steps:
        if step.status == StepStatus.RUNNING and step.account_profile:
            load.running[step.account_profile] += 1
    if run_status in _RESERVING_RUN_STATUSES and all(
        step.status == StepStatus.PENDING for step in steps
    ):
        carrying = [step for step in steps if step.account_profile]
        if carrying:
            first = min(carrying, key=lambda step: step.sequence)
            load.reserved[first.account_profile] += 1  # type: ignore[index]
    return load


def load_change(before: LoadDelta, after: LoadDelta) -> LoadDelta:
    change = LoadDelta()
    change.add(after)
    change.add(before, -1)
    return change


_TABLE = AccountLoadCount._meta.db_table


def apply_load_delta(delta: LoadDelta) -> None:
    """Add `delta` to the kept counts: one statement, none when nothing changes."""
    rows = delta.rows()
    if not rows:
        return
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    params: list[str | int | None] = []
    for account, running, reserved in rows:
        params += [account, running, reserved, now]
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{_TABLE}" (account_profile, running, reserved, updated_at) '
            f"VALUES {values} ON CONFLICT (account_profile) DO UPDATE SET "
            f'running = "{_TABLE}".running + excluded.running, '
            f'reserved = "{_TABLE}".reserved + excluded.reserved, '
            "updated_at = excluded.updated_at",
            params,
        )


def read_account_loads() -> tuple[dict[str, int], dict[str, int]]:
    """(running, reserved) per account from the kept counts, accounts with no load left out."""
    running: dict[str, int] = {}
    reserved: dict[str, int] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT account_profile, running, reserved FROM "{_TABLE}" '
            "WHERE running <> 0 OR reserved <> 0"
        )
        for account, n_running, n_reserved in cursor.fetchall():
            if n_running:
                running[account] = n_running
            if n_reserved:
                reserved[account] = n_reserved
    return running, reserved


# --- recount from the rows --------------------------------------------------------------------

# Running steps per account: idx_workflow_step_runs_status.
_RUNNING_SQL = f"""
SELECT account_profile, COUNT(*)
FROM "{WorkflowStepRun._meta.db_table}"
WHERE status = %s AND account_profile IS NOT NULL
GROUP BY account_profile
"""

# Reserved load in one pass over the steps of queued/running runs, with window functions:
# - rn = 1 marks each run's first account-carrying step;
# - started > 0 marks a run that has begun a step (its later steps reserve nothing).
_RESERVED_SQL = f"""
SELECT account_profile, COUNT(*) FROM (
    SELECT s.account_profile, s.status,
           ROW_NUMBER() OVER (
               PARTITION BY s.workflow_run_id
               ORDER BY CASE WHEN s.account_profile IS NULL THEN 1 ELSE 0 END, s.sequence
           ) AS rn,
           SUM(CASE WHEN s.status <> %s THEN 1 ELSE 0 END) OVER (
               PARTITION BY s.workflow_run_id
           ) AS started
    FROM "{WorkflowStepRun._meta.db_table}" s
    JOIN "{WorkflowRun._meta.db_table}" r ON r.id = s.workflow_run_id
    WHERE r.status IN (%s, %s)
) firsts
WHERE rn = 1 AND started = 0 AND account_profile IS NOT NULL AND status = %s
GROUP BY account_profile
"""


def recount_account_loads() -> tuple[dict[str, int], dict[str, int]]:
    """(running, reserved) per account recomputed from the step and run rows (the truth the
    kept counts must equal). Its cost grows with the queued runs: never on the admission path."""
    with connection.cursor() as cursor:
        cursor.execute(_RUNNING_SQL, [str(StepStatus.RUNNING)])
        running = {account: n for account, n in cursor.fetchall()}
        cursor.execute(
            _RESERVED_SQL,
            [
                str(StepStatus.PENDING),
                str(RunStatus.QUEUED),
                str(RunStatus.RUNNING),
                str(StepStatus.PENDING),
            ],
        )
        reserved = {account: n for account, n in cursor.fetchall()}
    return running, reserved


@dataclass(frozen=True)
class Drift:
    account_profile: str
    kept_running: int
    kept_reserved: int
    running: int
    reserved: int

    def to_dict(self) -> dict[str, object]:
        return {
            "accountProfile": self.account_profile,
            "kept": {"running": self.kept_running, "reserved": self.kept_reserved},
            "rows": {"running": self.running, "reserved": self.reserved},
        }


def _drift(
    kept: tuple[Mapping[str, int], Mapping[str, int]],
    truth: tuple[Mapping[str, int], Mapping[str, int]],
) -> list[Drift]:
    accounts = sorted(set(kept[0]) | set(kept[1]) | set(truth[0]) | set(truth[1]))
    found = []
    for account in accounts:
        values = (
            kept[0].get(account, 0),
            kept[1].get(account, 0),
            truth[0].get(account, 0),
            truth[1].get(account, 0),
        )
        if values[:2] != values[2:]:
            found.append(Drift(account, *values))
    return found


@contextmanager
def read_snapshot() -> Iterator[None]:
    """Several reads that see one state of the ledger while other processes write.

    SQLite: the IMMEDIATE transaction holds the write lock, so nothing commits meanwhile.
    PostgreSQL: READ COMMITTED gives each statement its own snapshot, so the kept counts read
    before a commit and the rows read after it would differ with no drift; REPEATABLE READ
    gives the whole transaction the first statement's snapshot. Only an outermost transaction
    can set its level; a nested one already sees what its outer transaction sees.
    """
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"
                )
        yield


def account_load_drift() -> list[Drift]:
    """Accounts whose kept counts differ from a recount of the rows (read only, one snapshot:
    safe while clusters run)."""
    with read_snapshot():
        return _drift(read_account_loads(), recount_account_loads())


def repair_account_loads(*, dry_run: bool = False) -> list[Drift]:
    """Recount from the rows and set the kept counts to it; returns the drift it found.

    Under the admission lock (no admission or step start meanwhile) and with the count rows
    locked before the recount (a step finishing meanwhile applies its change after ours, on
    top of the recount that did not see it yet, or before it, and the recount sees it).
    """
    with transaction.atomic():
        admission_lock()
        list(AccountLoadCount.objects.select_for_update().values_list("pk", flat=True))
        found = _drift(read_account_loads(), recount_account_loads())
        if found and not dry_run:
            delta = LoadDelta()
            for drift in found:
                delta.running[drift.account_profile] += (
                    drift.running - drift.kept_running
                )
                delta.reserved[drift.account_profile] += (
                    drift.reserved - drift.kept_reserved
                )
            apply_load_delta(delta)
    return found
