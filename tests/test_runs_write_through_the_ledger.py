"""Execution writes the record only through the ledger: no module of `runs/` calls a
queryset's or a model's writing methods (`update`, `create`, `bulk_create`, `delete`,
`save`, `get_or_create`, `update_or_create`) on a model; it hands what happened to
`ledger.services` (a run's delivery record, its step commits, its discard:
ledger/services/delivery.py) or to the record's own modules (ledger.instances,
ledger.queue). Read with `ast`; no database."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.sqlite  # reads files only: one suite runs it

ROOT = Path(__file__).resolve().parents[1]
WRITES = {
    "update",
    "create",
    "bulk_create",
    "bulk_update",
    "delete",
    "get_or_create",
    "update_or_create",
}


def row_writes(source: str, origin: str) -> list[str]:
    """`origin:line` of each `<Model>.objects...<write>(...)` and `<row>.save(...)` of a
    model row (a name bound from `<Model>.objects...`), in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        chain = ast.unparse(node.func.value)
        if node.func.attr in WRITES and ".objects" in f".{chain}":
            found.append(f"{origin}:{node.lineno} {ast.unparse(node.func)}")
        elif node.func.attr == "save" and ".objects" in chain:
            found.append(f"{origin}:{node.lineno} {ast.unparse(node.func)}")
    return found


def test_runs_write_no_row_of_their_own() -> None:
    found = [
        hit
        for path in sorted((ROOT / "runs").rglob("*.py"))
        for hit in row_writes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "\n".join(found)


def test_the_check_catches_a_row_write() -> None:
    source = (
        "WorkflowRun.objects.filter(pk=run_id).update(delivery_json=record)\n"
        "ClusterInstance.objects.filter(instance__in=gone).update(ended_at=now)\n"
        "RunWorker.objects.create(host=host)\n"
        "record.update(state='delivered')\n"  # a dict: not a row
        "WorkflowRun.objects.filter(pk=1).values_list('id', flat=True)\n"  # a read
        "self.work.save(step_id)\n"  # not a model row
    )
    assert [hit.split(" ")[0] for hit in row_writes(source, "x.py")] == [
        "x.py:1",
        "x.py:2",
        "x.py:3",
    ]
