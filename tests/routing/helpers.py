"""Envelopes and option shortcuts for routing tests."""

from __future__ import annotations

import itertools
from typing import Any

from routing.admission import RouteOptions, RouteResult, route_event, route_options

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
