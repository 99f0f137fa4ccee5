"""A batched drain's writes cost the same on a large ledger as on an empty one (issue 18).

SQLite checks deferred foreign keys by looking up the child rows of every parent row
inserted while a violation is outstanding: a batch inserts its work items (which name their
runs) before the runs, so each run insert looks up the items naming it. Without an index on
`workflow_work_items.workflow_run_id` (ledger 0008) that lookup read every item, and a drain
slowed down as the ledger grew. Measured here in SQLite virtual-machine instructions, which,
unlike time, do not depend on what else the machine is doing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from tests.routing.helpers import generic_event

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

BATCH = 50
CAPS = {"max_active": 100_000, "max_active_per_project": 100_000}


class _RunInsertInstructions:
    """SQLite VM instructions spent in the statements that insert workflow runs."""

    EVERY = 100  # the progress handler fires once per this many instructions

    def __init__(self) -> None:
        self.ticks = 0
        self.inserts = 0
        self._on = False

    def _tick(self) -> int:
        if self._on:
            self.ticks += 1
        return 0  # 0: go on

    def __call__(
        self, execute: Any, sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if not sql.startswith('INSERT INTO "workflow_runs"'):
            return execute(sql, params, many, context)
        self.inserts += 1
        self._on = True
        try:
            return execute(sql, params, many, context)
        finally:
            self._on = False

    def per_run(self, runs: int) -> float:
        return self.ticks * self.EVERY / runs


def _drain_counting(n: int) -> float:
    """Ingest and drain `n` generic events; VM instructions per run in the runs INSERTs."""
    inbox_ingest(
        enumerate((generic_event(project=f"/srv/p{i % 5}") for i in range(n)), start=1)
    )
    counter = _RunInsertInstructions()
    connection.ensure_connection()
    raw = connection.connection
    raw.set_progress_handler(counter._tick, counter.EVERY)
    try:
        with connection.execute_wrapper(counter):
            report = drain_run(
                options=drain_options(
                    "generic", {**CAPS, "max_dispatch": n, "limit": n}
                ),
                env={},
            )
    finally:
        raw.set_progress_handler(None, counter.EVERY)
    assert report.counts["created"] == n, report.counts
    assert counter.inserts >= 1
    return counter.per_run(n)


@pytest.mark.slow  # over a second of CPU: left out of make test-fast
def test_inserting_a_batchs_runs_costs_the_same_with_many_items_already_queued(
    settings: Any,
) -> None:
    settings.LOOPSWEB_DRAIN_BATCH_SIZE = BATCH
    empty = _drain_counting(BATCH)
    _drain_counting(20 * BATCH)  # 1,000 more queued items (and runs)
    large = _drain_counting(BATCH)
    # Without the index each run's lookup read every item: ~20x here.
    assert large < 2 * empty, (empty, large)
