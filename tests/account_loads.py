"""Account-load checks any test can use: the kept counts must equal a recount of the rows.

    from tests.account_loads import assert_account_counts_match_rows
    assert_account_counts_match_rows()   # after any ledger operation

`sync_account_counts()` is for fixtures that write step or run rows directly (factories,
seeds): it sets the kept counts to the recount, as `manage.py recount_account_loads` does.
"""

from __future__ import annotations

from ledger.models import WorkflowRun, WorkflowStepRun
from ledger.services.account_loads import (
    account_load_drift,
    apply_load_delta,
    load_change,
    repair_account_loads,
    run_load,
)


def assert_account_counts_match_rows() -> None:
    """Safe beside running processes: both sides are read in one snapshot."""
    drift = account_load_drift()
    assert drift == [], "kept counts != recount of the rows: " + "; ".join(
        str(d.to_dict()) for d in drift
    )


def sync_account_counts() -> None:
    repair_account_loads()


def release_run_load(run_id: str) -> None:
    """Before a test ends a run by writing its rows directly: release the load it kept."""
    run = WorkflowRun.objects.get(pk=run_id)
    steps = list(WorkflowStepRun.objects.filter(workflow_run_id=run_id))
    apply_load_delta(load_change(run_load(run.status, steps), run_load(None, [])))
