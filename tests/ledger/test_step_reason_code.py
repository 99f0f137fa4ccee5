"""The step's stored reason code (issue 42): set by `step_finish`, cleared by a new start,
and backfilled by migration 0022 from the rows written before it."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection

from ledger import services
from ledger.models import RunStatus, StepReasonCode, StepStatus, WorkflowStepRun
from tests.factories import make_run, make_step_run

pytestmark = pytest.mark.django_db


def _finish(status: str, **result: bool) -> WorkflowStepRun:
    run = make_run(status=RunStatus.QUEUED)
    step = make_step_run(workflow_run=run)
    assert services.run_claim(run_id=run.id, worker="w") is not None
    assert services.step_start(step_run_id=step.id, worker="w").started
    with_result = services.StepResult(status=status, error="boom", **result)
    services.step_complete(
        step_run_id=step.id,
        worker="w",
        result=with_result,
        end=services.RunEnd(status=RunStatus.FAILED),
    )
    return WorkflowStepRun.objects.get(pk=step.id)


@pytest.mark.parametrize(
    ("status", "flags", "code"),
    [
        (StepStatus.SUCCEEDED, {}, StepReasonCode.NONE),
        (StepStatus.FAILED, {}, StepReasonCode.FAILED),
        (StepStatus.TIMED_OUT, {}, StepReasonCode.FAILED),
        (StepStatus.FAILED, {"rate_limited": True}, StepReasonCode.RATE_LIMITED),
        (StepStatus.FAILED, {"login_failed": True}, StepReasonCode.LOGIN_FAILED),
    ],
)
def test_finishing_a_step_stores_why_it_did_not_succeed(
    status: str, flags: dict[str, bool], code: str
) -> None:
    step = _finish(status, **flags)
    assert step.status == status
    assert step.reason_code == code


def test_the_backfill_codes_old_failed_rows_from_the_runners_note() -> None:
    run = make_run()
    limited = make_step_run(
        workflow_run=run,
        status=StepStatus.FAILED,
        error="agent exited with code 1; provider rate limit: HTTP 429",
    )
    failed = make_step_run(
        workflow_run=run, status=StepStatus.TIMED_OUT, error="timed out"
    )
    succeeded = make_step_run(workflow_run=run, status=StepStatus.SUCCEEDED)
    coded = make_step_run(
        workflow_run=run,
        status=StepStatus.FAILED,
        reason_code=StepReasonCode.LOGIN_FAILED,
    )
    migration = importlib.import_module("ledger.migrations.0023_step_reason_code")

    migration.backfill(apps, SimpleNamespace(connection=connection))

    codes = dict(
        WorkflowStepRun.objects.filter(workflow_run=run).values_list(
            "id", "reason_code"
        )
    )
    assert codes == {
        limited.id: StepReasonCode.RATE_LIMITED,
        failed.id: StepReasonCode.FAILED,
        succeeded.id: StepReasonCode.NONE,
        coded.id: StepReasonCode.LOGIN_FAILED,  # a code already stored is kept
    }
