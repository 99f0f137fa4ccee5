"""What an admission answers: RouteResult (upstream's report fields, camelCase) and the
work item as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
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
    # The task the result came from (todos-task: id, title, description, tags, project
    # path) and the workflow body the plan rendered (shown when no spec row was made):
    # the full report carries both, as upstream's evidence does (docs/upstream.md §5.3).
    task: dict[str, Any] | None = None
    workflow_body: dict[str, Any] | None = None
    workflow_name: str | None = None
    # Fields of a PR review gate's skip (routing.admission.review_gate): routeError,
    # prReviewRouting, freshnessSkip, prState.
    extra: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "dryRun": self.dry_run}
        if self.kind in (THROTTLED, SKIPPED):
            # docs/upstream.md §3.8: an eligibility skip is `skipped: true`; a throttled route is a skip
            # whose work item waits at the source.
            out["skipped"] = True
        if self.kind == THROTTLED:
            out["queuedAtSource"] = True
        if self.kind == CREATED:
            out["deduped"] = False
        elif self.kind == DEDUPED:
            out["deduped"] = True
            out["dedupedBy"] = "work-item"
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
        if self.task is not None:
            out["task"] = self.task
        if self.eligibility is not None:
            out["eligibility"] = self.eligibility
        if self.work_item is not None:
            out["workItem"] = work_item_to_dict(self.work_item)
        if self.invocation is not None:
            out["invocation"] = invocation_to_dict(self.invocation)
        if self.workflow is not None:
            out["workflow"] = workflow_to_dict(self.workflow)
        elif self.workflow_body is not None:  # rendered, not stored (throttled)
            out["workflow"] = {
                "name": self.workflow_name,
                "stored": False,
                **self.workflow_body,
            }
        if self.loop is not None:
            out["loop"] = loop_to_dict(self.loop)
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
        if self.extra:
            out.update(self.extra)
        return out

    def human(self) -> str:
        """The upstream one-line summary (docs/upstream.md §3.8)."""
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


def _stamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def invocation_to_dict(invocation: WorkflowInvocation) -> dict[str, Any]:
    """The whole invocation row, upstream's names (docs/upstream.md §1.1, §3.9)."""
    return {
        "id": invocation.id,
        "workflowId": invocation.workflow_id,
        "templateId": invocation.template_id,
        "sourceKind": invocation.source_kind,
        "sourceId": invocation.source_id,
        "sourceDedupeKey": invocation.source_dedupe_key,
        "sourceRef": invocation.source_json,
        "subjectKind": invocation.subject_kind,
        "subjectId": invocation.subject_id,
        "subjectPath": invocation.subject_path,
        "subjectUrl": invocation.subject_url,
        "subjectRef": invocation.subject_json,
        "intent": invocation.intent,
        "scope": invocation.scope_json,
        "outputPolicy": invocation.output_policy_json,
        "createdAt": _stamp(invocation.created_at),
        "updatedAt": _stamp(invocation.updated_at),
    }


def workflow_to_dict(spec: WorkflowSpec) -> dict[str, Any]:
    """The spec row with its body (version, goal, steps)."""
    return {
        "id": spec.id,
        "name": spec.name,
        "description": spec.description,
        "status": spec.status,
        "version": spec.version,
        "goal": spec.goal_json,
        "steps": spec.steps_json,
    }


def loop_to_dict(loop: Loop) -> dict[str, Any]:
    """The one-shot loop, its target (with `input`) and schedule (docs/upstream.md §3.6)."""
    return {
        "id": loop.id,
        "name": loop.name,
        "description": loop.description,
        "status": loop.status,
        "schedule": loop.schedule_json,
        "target": loop.target_json,
        "overlap": loop.overlap,
        "maxAttempts": loop.max_attempts,
        "retryDelayMs": loop.retry_delay_ms,
        "leaseMs": loop.lease_ms,
    }


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
