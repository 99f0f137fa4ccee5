"""todos-task route eligibility (docs/upstream.md §3.2.1-2).

Contract: a task is routed only when all of these hold, checked in this order; the
first failure is the skip reason:
1. explicit opt-in: tag ``auto:route`` or ``route:enabled``, or a truthy
   ``route_enabled`` / ``routeEnabled`` / ``automation_allowed`` / ``automationAllowed``
   field, or a truthy ``allowed`` on an automation record
   (else ``missing explicit route opt-in``);
2. the task status is not terminal or blocked (``task status is not routable: <s>``);
3. no disallowed tag, compared case-insensitively
   (``task has disallowed tag: <first such tag>``);
4. no truthy manual-gate field
   (``task metadata requires manual or approval-gated handling: <field>``).

Fields and tags are read from the union of records listed in docs/upstream.md §3.2.2 plus every
record's ``automation`` sub-object. Truthy means ``true``, ``1``, or the text
``"true"`` / ``"1"`` (trimmed, case-insensitive). An ineligible task is skipped with no
writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.errors import TODOS_TASK_ID_MISSING, ValidationError
from domain.events import TASK_ID_KEYS, object_field, record_tags, task_field

OPT_IN_TAGS: frozenset[str] = frozenset({"auto:route", "route:enabled"})
OPT_IN_FIELDS: tuple[str, ...] = (
    "route_enabled",
    "routeEnabled",
    "automation_allowed",
    "automationAllowed",
)
BLOCKED_STATUSES: frozenset[str] = frozenset(
    {"blocked", "completed", "done", "cancelled", "canceled", "failed", "archived"}
)
DISALLOWED_TAGS: frozenset[str] = frozenset(
    {
        "no-auto",
        "manual",
        "manual-required",
        "approval-required",
        "blocked",
        "completed",
        "done",
        "cancelled",
        "canceled",
        "failed",
        "archived",
    }
)
MANUAL_GATE_FIELDS: tuple[str, ...] = (
    "no_auto",
    "noAuto",
    "manual",
    "manual_required",
    "manualRequired",
    "requires_approval",
    "requiresApproval",
    "approval_required",
    "approvalRequired",
)
STATUS_KEYS: tuple[str, ...] = ("status", "task_status", "taskStatus")

MISSING_OPT_IN = "missing explicit route opt-in"
STATUS_NOT_ROUTABLE = "task status is not routable: {status}"
DISALLOWED_TAG = "task has disallowed tag: {tag}"
MANUAL_GATE = "task metadata requires manual or approval-gated handling: {field}"


@dataclass(frozen=True)
class Eligibility:
    eligible: bool
    reason: str | None = None
    opted_in: bool = False
    status: str | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"eligible": self.eligible}
        if self.reason is not None:
            out["reason"] = self.reason
        out["optedIn"] = self.opted_in
        if self.status is not None:
            out["status"] = self.status
        out["tags"] = list(self.tags)
        return out


def is_truthy(value: object) -> bool:
    if value is True:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value == 1
    if isinstance(value, str):
        return value.strip().lower() in {"true", "1"}
    return False


def todos_task_id(data: Mapping[str, Any]) -> str:
    task_id = task_field(dict(data), *TASK_ID_KEYS)
    if task_id is None:
        raise ValidationError(TODOS_TASK_ID_MISSING)
    return task_id


def eligibility_records(
    data: Mapping[str, Any], metadata: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The docs/upstream.md §3.2.2 union of records, in that order, keeping only objects."""

    def sub(record: object, key: str) -> dict[str, Any] | None:
        parent = object_field(record)
        return object_field(parent.get(key)) if parent is not None else None

    data_d = dict(data)
    meta_d = dict(metadata)
    task = sub(data_d, "task")
    payload = sub(data_d, "payload")
    payload_task = sub(payload, "task")
    meta_task = sub(meta_d, "task")
    candidates = [
        data_d,
        task,
        sub(task, "metadata"),
        payload,
        sub(payload, "metadata"),
        payload_task,
        sub(payload_task, "metadata"),
        sub(data_d, "metadata"),
        meta_d,
        meta_task,
        sub(meta_task, "metadata"),
        sub(meta_d, "automation"),
    ]
    records: list[dict[str, Any]] = []
    for candidate in candidates:
        # The same object can be reachable twice (e.g. metadata.automation); identity
        # dedupe keeps "first such tag" stable without comparing contents.
        if candidate is not None and all(candidate is not r for r in records):
            records.append(candidate)
    return records


def automation_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each record's ``automation`` sub-object (``metadata.automation`` among them)."""
    found: list[dict[str, Any]] = []
    for record in records:
        automation = object_field(record.get("automation"))
        if automation is not None and all(automation is not r for r in found):
            found.append(automation)
    return found


def task_route_eligibility(
    data: Mapping[str, Any], metadata: Mapping[str, Any]
) -> Eligibility:
    """Decide whether a todos task may be routed (see module docstring)."""
    records = eligibility_records(data, metadata)
    automation = automation_records(records)
    field_records = records + [
        a for a in automation if all(a is not r for r in records)
    ]

    tags: list[str] = []
    for record in field_records:
        for tag in record_tags(record):
            if tag not in tags:
                tags.append(tag)

    status_text = task_field(dict(data), *STATUS_KEYS)
    status = status_text.lower() if status_text is not None else None

    opted_in = (
        any(tag in OPT_IN_TAGS for tag in tags)
        or any(is_truthy(r.get(k)) for r in field_records for k in OPT_IN_FIELDS)
        or any(is_truthy(a.get("allowed")) for a in automation)
    )

    def result(reason: str | None) -> Eligibility:
        return Eligibility(
            eligible=reason is None,
            reason=reason,
            opted_in=opted_in,
            status=status,
            tags=tuple(tags),
        )

    if not opted_in:
        return result(MISSING_OPT_IN)
    if status is not None and status in BLOCKED_STATUSES:
        return result(STATUS_NOT_ROUTABLE.format(status=status))
    for tag in tags:
        if tag.lower() in DISALLOWED_TAGS:
            return result(DISALLOWED_TAG.format(tag=tag))
    for name in MANUAL_GATE_FIELDS:
        if any(is_truthy(r.get(name)) for r in field_records):
            return result(MANUAL_GATE.format(field=name))
    return result(None)
