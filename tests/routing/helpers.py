"""Envelopes and option shortcuts for routing tests, and the rows of a created route."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db.models import Model

from ledger.models import (
    AccountCooldown,
    AccountLoadCount,
    Loop,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from routing.admission import (
    CREATED,
    RouteOptions,
    RouteResult,
    route_event,
    route_options,
)
from routing.models import InboxEvent

_seq = itertools.count(1)


def generic_event(
    *, project: str = "/srv/app", group: str | None = None, **data: Any
) -> dict[str, Any]:
    n = next(_seq)
    payload: dict[str, Any] = {"project_path": project, "message": f"event {n}", **data}
    if group:
        payload["project_group"] = group
    return {"id": f"evt-{n}", "type": "build.failed", "source": "ci", "data": payload}


def todos_event(
    task_id: str | None = None, *, project: str = "/srv/app", **data: Any
) -> dict[str, Any]:
    task_id = task_id or f"task-{next(_seq)}"
    return {
        "id": f"evt-{task_id}",
        "type": "task.created",
        "source": "@hasna/todos",
        "data": {
            "id": task_id,
            "title": f"Fix {task_id}",
            "tags": ["auto:route"],
            "project_path": project,
            **data,
        },
    }


def plain_project(tmp_path: Path, settings: Any) -> Path:
    """A project directory inside the roots (`tmp_path` and /srv) that is not a git work
    tree."""
    directory = tmp_path / "plain"
    directory.mkdir()
    settings.LOOPSWEB_PROJECT_ROOTS = [str(tmp_path), "/srv"]
    return directory


def opts(**raw: Any) -> RouteOptions:
    return route_options(raw)


def route(
    kind: str = "generic",
    event: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    **raw: Any,
) -> RouteResult:
    return route_event(
        kind=kind, envelope=event or generic_event(), options=opts(**raw), env=env or {}
    )


@dataclass(frozen=True)
class CreatedRoute:
    """The rows an admission that created its run made, typed as present (a RouteResult
    types each of them optional: a throttled or deduped route has none of them)."""

    result: RouteResult
    work_item: WorkflowWorkItem
    invocation: WorkflowInvocation
    workflow: WorkflowSpec
    loop: Loop
    run: WorkflowRun


def created_route(result: RouteResult) -> CreatedRoute:
    """`result`'s rows; fails the test, showing the result, unless it created a run."""
    assert result.kind == CREATED, result.to_dict()
    item, invocation, spec = result.work_item, result.invocation, result.workflow
    loop, run = result.loop, result.run
    assert item is not None and invocation is not None and spec is not None, (
        result.to_dict()
    )
    assert loop is not None and run is not None, result.to_dict()
    return CreatedRoute(result, item, invocation, spec, loop, run)


def drain_rows() -> dict[str, Any]:
    """What drains left (inbox events, work items, step runs, the number of runs), in terms
    that do not depend on generated ids: equal after two drains that decided alike."""
    return {
        "inbox": sorted(
            InboxEvent.objects.values_list(
                "event_id", "state", "reason_code", "last_reason", "route_attempts"
            )
        ),
        "items": sorted(
            WorkflowWorkItem.objects.values_list(
                "source_ref", "status", "attempts", "route_scope", "project_key"
            )
        ),
        "steps": sorted(
            WorkflowStepRun.objects.values_list(
                "workflow_run__work_item__source_ref",
                "step_id",
                "status",
                "account_profile",
            )
        ),
        "runs": WorkflowRun.objects.count(),
    }


def wipe_drain_rows() -> None:
    """Delete what drains wrote (and the cooldowns and account loads their runs left), so a
    second drain of the same events starts from the same empty ledger."""
    models: tuple[type[Model], ...] = (
        InboxEvent,
        WorkflowWorkItem,
        AccountCooldown,
        WorkflowRun,
        Loop,
        WorkflowSpec,
        WorkflowInvocation,
        AccountLoadCount,
    )
    for model in models:
        model._default_manager.all().delete()
