"""Helpers of the account failover tests (issue 58): a one-step run admitted with pool
routing on, and a run's attempts as (account, status)."""

from __future__ import annotations

from pathlib import Path

from ledger.models import WorkflowInvocation, WorkflowRun, WorkflowStepAttempt
from tests.ledger.runner_helpers import admit_workflow, agent_step


def pooled_run(
    project: Path, pool: list[str], *, idle_ms: int | None = None
) -> WorkflowRun:
    """One agent step (`worker`) on the pool's first member, its run admitted with pool
    routing on over `pool` (as a route's admission records it), so failover may move it;
    `idle_ms`: its idle limit."""
    extra = {"idleTimeoutMs": idle_ms} if idle_ms else {}
    run = admit_workflow(
        [agent_step("worker", cwd=project, profile=pool[0], **extra)], template_id=None
    )
    WorkflowInvocation.objects.filter(pk=run.invocation_id).update(
        scope_json={
            "projectPath": str(project),
            "providerRouting": {
                "provider": "codewith",
                "pool": pool,
                "poolRouting": True,
            },
        }
    )
    run.refresh_from_db()
    return run


def attempts_of(run: WorkflowRun) -> list[tuple[str | None, str]]:
    return [
        (a.account_profile, a.status)
        for a in WorkflowStepAttempt.objects.filter(workflow_run=run).order_by(
            "started_at", "id"
        )
    ]
