"""The work-item statuses live once, in domain.statuses (issue 42): the model's choices and
the ledger's status sets are the domain's, member for member."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from domain.statuses import (
    ACTIVE_WORK_ITEM_STATES,
    TERMINAL_WORK_ITEM_STATES,
    UNCLEARED_WORK_ITEM_STATES,
    WorkItemState,
)
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    KEEP_WORK_ITEM_STATUSES,
    TERMINAL_WORK_ITEM_STATUSES,
    WorkflowWorkItem,
    WorkItemStatus,
)

pytestmark = pytest.mark.sqlite  # no database: one suite runs it

ROOT = Path(__file__).resolve().parents[2]


def test_the_model_choices_are_the_domain_states_member_for_member() -> None:
    assert [(s.name, s.value) for s in WorkItemStatus] == [
        (s.name, s.value) for s in WorkItemState
    ]
    field = WorkflowWorkItem._meta.get_field("status")
    assert [value for value, _ in field.choices or []] == list(WorkItemState)


def test_the_ledger_status_sets_are_the_domain_sets() -> None:
    assert set(ACTIVE_WORK_ITEM_STATUSES) == ACTIVE_WORK_ITEM_STATES
    assert set(TERMINAL_WORK_ITEM_STATUSES) == TERMINAL_WORK_ITEM_STATES
    assert set(KEEP_WORK_ITEM_STATUSES) == UNCLEARED_WORK_ITEM_STATES
    assert UNCLEARED_WORK_ITEM_STATES == set(WorkItemState) - {
        WorkItemState.QUEUED,
        WorkItemState.DEFERRED,
    }


def test_no_other_domain_module_spells_a_status_set() -> None:
    """domain/readmission.py once restated the statuses as strings: a set, tuple or list of
    two or more work-item status words (and nothing else) outside domain/statuses.py is
    such a copy (the todos tasks' own statuses, domain.eligibility, are another vocabulary)."""
    words = {state.value for state in WorkItemState}
    copies = []
    for path in sorted((ROOT / "domain").rglob("*.py")):
        if path.name == "statuses.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Set | ast.Tuple | ast.List):
                texts = {
                    e.value
                    for e in node.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
                if len(texts) >= 2 and texts <= words:
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert copies == []
