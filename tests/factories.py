"""make_<model>(**overrides) helpers: the smallest valid row, with overrides."""

from __future__ import annotations

import itertools
from typing import Any

from django.utils import timezone

from ledger.models import (
    Loop,
    RunStatus,
    StepStatus,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from tests.account_loads import sync_account_counts

_seq = itertools.count(1)


def make_invocation(**overrides: Any) -> WorkflowInvocation:
    n = next(_seq)
    fields: dict[str, Any] = {
        "source_kind": "event",
        "source_id": f"evt-{n}",
        "source_dedupe_key": f"generic-event:test:evt-{n}",
        "source_json": {"kind": "event", "id": f"evt-{n}"},
        "subject_kind": "event",
        "subject_id": f"evt-{n}",
        "subject_json": {"kind": "event", "id": f"evt-{n}"},
        "intent": "route",
    }
    fields.update(overrides)
    return WorkflowInvocation.objects.create(**fields)


def make_work_item(**overrides: Any) -> WorkflowWorkItem:
    n = next(_seq)
    fields: dict[str, Any] = {
        "route_key": "generic-event",
        "idempotency_key": f"generic-event:test:evt-{n}",
        "source_type": "task.created",
        "source_ref": f"evt-{n}",
        "subject_ref": f"subject-{n}",
        "status": WorkItemStatus.QUEUED,
    }
    fields.update(overrides)
    if "invocation" not in fields:
        fields["invocation"] = make_invocation(
            source_dedupe_key=fields["idempotency_key"]
        )
    return WorkflowWorkItem.objects.create(**fields)


def make_spec(**overrides: Any) -> WorkflowSpec:
    n = next(_seq)
    fields: dict[str, Any] = {"name": f"spec-{n}", "steps_json": [{"id": "worker"}]}
    fields.update(overrides)
    return WorkflowSpec.objects.create(**fields)


def make_loop(**overrides: Any) -> Loop:
    n = next(_seq)
    fields: dict[str, Any] = {
        "name": f"loop-{n}",
        "schedule_json": {"type": "once", "at": timezone.now().isoformat()},
        "target_json": {"type": "workflow"},
    }
    fields.update(overrides)
    return Loop.objects.create(**fields)


def make_run(**overrides: Any) -> WorkflowRun:
    fields: dict[str, Any] = {"status": RunStatus.RUNNING}
    fields.update(overrides)
    if "workflow" not in fields:
        fields["workflow"] = make_spec()
    fields.setdefault("workflow_name", fields["workflow"].name)
    return WorkflowRun.objects.create(**fields)


def make_step_run(**overrides: Any) -> WorkflowStepRun:
    n = next(_seq)
    fields: dict[str, Any] = {
        "step_id": f"step-{n}",
        "sequence": 0,
        "status": StepStatus.PENDING,
    }
    fields.update(overrides)
    if "workflow_run" not in fields:
        fields["workflow_run"] = make_run()
    step = WorkflowStepRun.objects.create(**fields)
    sync_account_counts()  # a row written directly: keep the account counts true
    return step


def make_staff_user(username: str = "ops", *perms: str, **fields: Any) -> Any:
    """An active staff user (not a superuser) holding `perms` (`app.codename`, e.g.
    ledger.webkit.access.ITEMS): what /ops/, the API's sessions and /metrics let see."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    fields.setdefault("is_staff", True)
    user = get_user_model().objects.create_user(username, password="pw", **fields)
    for perm in perms:
        app, _, codename = perm.partition(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app, codename=codename)
        )
    return user
