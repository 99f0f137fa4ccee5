"""What an admission answers: RouteResult (upstream's report fields, camelCase) and the
work item as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.events import (
    Envelope,
)
from domain.throttle import (
    AdmissionDecision,
)
from ledger.models import (
    Loop,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowWorkItem,
)

PUBLIC_REASON_CHARS = 240

CREATED, DEDUPED, THROTTLED, SKIPPED = "created", "deduped", "throttled", "skipped"


@dataclass
class RouteResult:
    kind: str
    idempotency_key: str | None
    event: Envelope
    reason: str | None = None
    reason_code: str | None = None
    work_item: WorkflowWorkItem | None = None
    invocation: WorkflowInvocation | None = None
    workflow: WorkflowSpec | None = None
    loop: Loop | None = None
    run: WorkflowRun | None = None
    throttle: AdmissionDecision | None = None
    account_profiles: dict[str, str] | None = None
    route_scope: str | None = None
    requeue: dict[str, Any] | None = None
    eligibility: dict[str, Any] | None = None
    task_id: str | None = None
    sandbox_preflight: list[dict[str, str]] | None = None
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "dryRun": self.dry_run}
        if self.kind == THROTTLED:
            # §3.8: a throttled route is a skip whose work item waits at the source.
            out["skipped"] = True
            out["queuedAtSource"] = True
        if self.idempotency_key:
            out["idempotencyKey"] = self.idempotency_key
        if self.reason:
            out["reason"] = self.reason
        if self.reason_code:
            out["reasonCode"] = self.reason_code
        out["event"] = {
            "id": self.event.id,
            "type": self.event.type,
            "source": self.event.source,
        }
        if self.task_id:
            out["taskId"] = self.task_id
        if self.eligibility is not None:
            out["eligibility"] = self.eligibility
        if self.work_item is not None:
            out["workItem"] = work_item_to_dict(self.work_item)
        if self.invocation is not None:
            out["invocation"] = {"id": self.invocation.id}
        if self.workflow is not None:
            out["workflow"] = {"id": self.workflow.id, "name": self.workflow.name}
        if self.loop is not None:
            out["loop"] = {"id": self.loop.id, "name": self.loop.name}
        if self.run is not None:
            out["run"] = {"id": self.run.id, "status": self.run.status}
        if self.account_profiles:
            out["accountProfiles"] = self.account_profiles
            out["routeScope"] = self.route_scope
        if self.throttle is not None:
            out["throttle"] = self.throttle.to_dict()
        if self.requeue is not None:
            out["requeue"] = self.requeue
        if self.sandbox_preflight is not None:
            out["sandboxPreflight"] = self.sandbox_preflight
        return out

    def human(self) -> str:
        """The upstream one-line summary (§3.8)."""
        noun = f"task {self.task_id}" if self.task_id else f"event {self.event.id}"
        if self.kind == CREATED and self.loop is not None and self.workflow is not None:
            prefix = "dry-run " if self.dry_run else ""
            return (
                f"{prefix}created {self.loop.id} ({self.loop.name}) workflow={self.workflow.name} "
                f"event={self.event.id} idempotency={self.idempotency_key}"
            )
        if self.kind == DEDUPED and self.work_item is not None:
            return (
                f"deduped existing work item {self.work_item.id} for event={self.event.id} "
                f"idempotency={self.idempotency_key}"
            )
        return f"skipped {noun}: {self.reason}"


def work_item_to_dict(item: WorkflowWorkItem) -> dict[str, Any]:
    reason = item.last_reason
    if reason and len(reason) > PUBLIC_REASON_CHARS:
        reason = reason[: PUBLIC_REASON_CHARS - 1] + "…"
    return {
        "id": item.id,
        "routeKey": item.route_key,
        "idempotencyKey": item.idempotency_key,
        "status": item.status,
        "attempts": item.attempts,
        "routeScope": item.route_scope,
        "projectKey": item.project_key,
        "projectGroup": item.project_group,
        "lastReason": reason,
        "reasonCode": item.reason_code,
        "workflowId": item.workflow_id,
        "loopId": item.loop_id,
        "workflowRunId": item.workflow_run_id,
    }
