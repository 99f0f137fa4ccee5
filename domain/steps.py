"""The order a run's steps run in: dependencies first, ties by sequence (pure).

A step's `dependsOn` (one id or a list) names steps of the same run. An unknown dependency,
a step missing from the workflow spec, or a cycle (a step naming itself included) is a
`PlanError`, and the runner fails the run with it before any step starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from domain.errors import ApplicationError

STEP_DEPENDS_UNKNOWN = "step {step_id} depends on unknown step {dependency}"
STEP_SPEC_MISSING = "step {step_id} is not in the workflow spec"
STEPS_CYCLE = "dependency cycle among steps: {steps}"


class PlanError(ApplicationError):
    """The run's steps cannot be ordered (unknown dependency, cycle, missing spec)."""


def execution_order(
    steps: Sequence[tuple[str, int]], specs: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Step ids in run order: dependencies first, ties by sequence (pure; Kahn's algorithm)."""
    sequence = dict(steps)
    deps: dict[str, set[str]] = {}
    for step_id, _ in steps:
        if step_id not in specs:
            raise PlanError(STEP_SPEC_MISSING.format(step_id=step_id))
        raw = specs[step_id].get("dependsOn") or []
        if isinstance(raw, str):
            raw = [raw]
        for dependency in raw:
            if dependency not in sequence:
                raise PlanError(
                    STEP_DEPENDS_UNKNOWN.format(step_id=step_id, dependency=dependency)
                )
        deps[step_id] = set(raw)  # a step naming itself never becomes ready: a cycle
    order: list[str] = []
    placed: set[str] = set()
    while len(order) < len(steps):
        ready = [s for s in deps if s not in placed and deps[s] <= placed]
        if not ready:
            stuck = sorted(
                (s for s in deps if s not in placed), key=sequence.__getitem__
            )
            raise PlanError(STEPS_CYCLE.format(steps=", ".join(stuck)))
        nxt = min(ready, key=sequence.__getitem__)
        order.append(nxt)
        placed.add(nxt)
    return order
