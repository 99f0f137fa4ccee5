"""Envelopes that can never route: the one check behind the API's `warnings` and
`ingest_events`' warnings (and their strict modes), so both say the same thing in the same
words.

An envelope is planned (no store access) under the kind a drain of its type uses (`task.*`
events are todos tasks, everything else generic: `kind_for_event_type`) with default
options and no caps, so only what is wrong with the envelope itself shows: eligibility
skips (no opt-in, a manual gate, a terminal status) and plan errors (no task id, no
project).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from domain.errors import ApplicationError
from domain.events import Envelope, parse_envelope
from routing.admission import RouteOptions, RouteResult, plan_reads, plan_route
from routing.drains.sources import TODOS_EVENT_PREFIX

NEVER_ROUTES = (
    "{n} envelope(s) can never be routed ({flag} refuses the batch); first at {at}: "
    "{error}"
)


def kind_for_event_type(event_type: str) -> str:
    """The route kind whose drain takes events of this type (the drains' source filter)."""
    return "todos-task" if event_type.startswith(TODOS_EVENT_PREFIX) else "generic"


def never_routes(envelope: Envelope, *, cwd: str) -> str | None:
    """Why no drain will ever admit `envelope` (the reason a drain would record), or None.

    A PR review task the gate skips for want of a reviewer or an author is not one: a drain
    with `--github-reviewer`, or the forge, may supply them (docs/upstream.md §3.2.11)."""
    kind = kind_for_event_type(envelope.type)
    try:
        plan = plan_route(
            kind=kind,
            envelope=envelope,
            options=RouteOptions(),
            env={},
            cwd=cwd,
            reads=plan_reads(accounts=False),
        )
    except ApplicationError as exc:
        return str(exc)
    if not isinstance(plan, RouteResult):
        return None
    extra = plan.extra or {}
    if extra.get("prReviewRouting") and not extra.get("freshnessSkip"):
        return None
    return plan.reason


def never_routable_warning(
    position: str, obj: object, *, cwd: str
) -> dict[str, Any] | None:
    """The warning for one envelope object at `position`, or None (also for a malformed
    envelope: ingestion refuses that one on its own)."""
    try:
        envelope = parse_envelope(obj)
    except ApplicationError:
        return None
    reason = never_routes(envelope, cwd=cwd)
    if not reason:
        return None
    return {
        "at": position,
        "source": envelope.source,
        "id": envelope.id,
        "kind": kind_for_event_type(envelope.type),
        "warning": reason,
    }


def never_routable(items: Iterable[tuple[str, object]], *, cwd: str) -> list[dict]:
    """The warnings of (position, envelope object) pairs, in order."""
    warnings = []
    for position, obj in items:
        warning = never_routable_warning(position, obj, cwd=cwd)
        if warning is not None:
            warnings.append(warning)
    return warnings


def never_routes_message(warnings: list[dict[str, Any]], *, flag: str) -> str:
    first = warnings[0]
    return NEVER_ROUTES.format(
        n=len(warnings), flag=flag, at=first["at"], error=first["warning"]
    )
