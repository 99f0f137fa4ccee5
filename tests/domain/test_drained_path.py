"""A drained todos task's project in upstream's order (docs/upstream.md
§5.1, domain.events contract 6): `project_path`, the metadata, the description's
`Repository:` line, then `working_dir`; and the drained envelope routed there. Through a
drain: tests/routing/test_upstream_gate_paths.py."""

from __future__ import annotations

from typing import Any

import pytest

from domain.events import (
    drained_task_path,
    parse_envelope,
    todos_project_path_hint,
    with_route_path,
)

REPO_LINE = "Fix it.\nRepository: /srv/from-line\n"

ORDER: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    # case, task (data), envelope metadata -> path
    (
        "project_path first",
        {
            "project_path": "/srv/field",
            "working_dir": "/srv/wd",
            "metadata": {"project_path": "/srv/meta"},
            "description": REPO_LINE,
        },
        {},
        "/srv/field",
    ),
    ("projectPath", {"projectPath": "/srv/field", "cwd": "/srv/wd"}, {}, "/srv/field"),
    (
        "the task's metadata before the line and working_dir",
        {
            "working_dir": "/srv/wd",
            "metadata": {"project_canonical_path": "/srv/meta"},
            "description": REPO_LINE,
        },
        {},
        "/srv/meta",
    ),
    (
        "the envelope's metadata too",
        {"working_dir": "/srv/wd", "description": REPO_LINE},
        {"projectPath": "/srv/envelope-meta"},
        "/srv/envelope-meta",
    ),
    (
        "the task's metadata before the envelope's",
        {"metadata": {"project_path": "/srv/task-meta"}},
        {"project_path": "/srv/envelope-meta"},
        "/srv/task-meta",
    ),
    (
        "the Repository: line before working_dir",
        {"working_dir": "/srv/wd", "description": REPO_LINE},
        {},
        "/srv/from-line",
    ),
    ("working_dir", {"workingDir": "/srv/wd", "cwd": "/srv/cwd"}, {}, "/srv/wd"),
    ("cwd", {"cwd": "/srv/cwd", "metadata": {"working_dir": "/x"}}, {}, "/srv/cwd"),
    (
        "the metadata's working_dir last",
        {"metadata": {"cwd": "/srv/meta-cwd"}},
        {"working_dir": "/srv/envelope-wd"},
        "/srv/meta-cwd",
    ),
    ("a nested task", {"task": {"project_path": "/srv/nested"}}, {}, "/srv/nested"),
    ("nothing", {"title": "no path"}, {}, None),
]


@pytest.mark.parametrize(
    ("case", "data", "metadata", "path"), ORDER, ids=[c[0] for c in ORDER]
)
def test_a_drained_tasks_project_in_upstreams_order(
    case: str, data: dict[str, Any], metadata: dict[str, Any], path: str | None
) -> None:
    assert drained_task_path(data, metadata) == path, case


def test_the_route_order_differs_and_the_drained_envelope_routes_where_the_drain_looked() -> (
    None
):
    data = {"id": "t-1", "working_dir": "/srv/wd", "description": REPO_LINE}
    envelope = parse_envelope(
        {"id": "e-1", "type": "task.created", "source": "todos", "data": data}
    )
    # A route of the event as delivered (docs/upstream.md §3.2.3) takes working_dir.
    assert todos_project_path_hint(envelope.data, {}, option=None) == "/srv/wd"
    drained = with_route_path(envelope, drained_task_path(envelope.data, {}))
    assert drained.data["route_project_path"] == "/srv/from-line"
    assert drained.raw["data"]["route_project_path"] == "/srv/from-line"
    assert todos_project_path_hint(drained.data, {}, option=None) == "/srv/from-line"
    assert envelope.data == data and "route_project_path" not in envelope.raw["data"]
    assert with_route_path(envelope, None) is envelope
    assert with_route_path(drained, "/srv/from-line") is drained


def test_an_owner_repo_line_goes_through_find_checkout() -> None:
    data = {"working_dir": "/srv/wd", "description": "Repository: hasna/loops"}
    assert drained_task_path(data, {}, find_checkout=lambda name: f"/srv/{name}") == (
        "/srv/hasna/loops"
    )
    assert drained_task_path(data, {}) == "/srv/wd"  # no checkout: the next in order
