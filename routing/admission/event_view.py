"""What a route reads of its event, decided once by its route key.

A todos task and a generic event differ in where the project path, the idempotency key, the
names, the pool seed, the subject and the prompt text come from, and in how the invocation
records its source and subject. `event_view` decides todos-vs-generic once and returns an
`EventView` holding all of it (or the RouteResult of an ineligible task: skipped);
`plan_route` (routing.admission.plan) and `invocation_fields` read the view and never ask
the route key again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain.eligibility import task_route_eligibility, todos_task_id
from domain.events import (
    Envelope,
    first_string,
    generic_project_path_hint,
    task_field,
    todos_project_path_hint,
)
from domain.keys import (
    GENERIC_EVENT,
    TODOS_TASK,
    generic_event_key,
    generic_names,
    generic_pool_seed,
    todos_task_names,
)
from routing.admission.options import RouteOptions
from routing.admission.results import SKIPPED, RouteResult
from routing.admission.review_gate import todos_review_key
from routing.admission.route_accounts import RouteAccounts
from runs.projects import repository_checkout


@dataclass(frozen=True)
class EventView:
    """One event as its route reads it (see the module docstring)."""

    envelope: Envelope
    route_key: str
    is_task: bool  # a todos task (route key todos-task), else a generic event
    raw_path: (
        str | None
    )  # the project path the event or --project-path names, unchecked
    key: str  # the idempotency key
    workflow_name: str
    loop_name: str
    seed: str  # the pool's hash seed
    subject_ref: str
    title: str | None
    body: str | None
    task_id: str | None = None
    tags: tuple[str, ...] = ()
    # The PR review gate's reading (routing.admission.review_gate), when it applied.
    pr_review_routing: dict[str, Any] | None = None

    def task(self, project_path: str | None) -> dict[str, Any] | None:
        """The todos task as results report it (None for a generic event)."""
        if not self.is_task:
            return None
        return _task(self.task_id, self.envelope.data, self.tags, project_path)

    def subject(self, project_path: str) -> dict[str, Any]:
        """The invocation's subject: the task, or the event."""
        if self.is_task:
            return {
                "kind": "task",
                "id": self.task_id,
                "path": project_path,
                "raw": {"title": self.title, "description": self.body},
            }
        return {
            "kind": "event",
            "id": self.subject_ref,
            "path": project_path,
            "raw": {"message": self.body},
        }

    def raw_source(self) -> dict[str, Any]:
        """The event fields the invocation's source records."""
        envelope = self.envelope
        if self.is_task:
            return {
                "type": envelope.type,
                "source": envelope.source,
                "subject": envelope.subject,
            }
        return {"source": envelope.source, "type": envelope.type}


def event_view(
    route_key: str, envelope: Envelope, options: RouteOptions
) -> EventView | RouteResult:
    """The view of `envelope` for its route, or the skipped result of a todos task that is
    not eligible (docs/upstream.md §3.2.2)."""
    if route_key == TODOS_TASK:
        return _task_view(envelope, options)
    return _generic_view(envelope, options)


def _task_view(envelope: Envelope, options: RouteOptions) -> EventView | RouteResult:
    data, metadata = envelope.data, envelope.metadata
    task_id = todos_task_id(data)
    eligibility = task_route_eligibility(data, metadata)
    raw_path = todos_project_path_hint(
        data, metadata, option=options.project_path, find_checkout=repository_checkout
    )
    if not eligibility.eligible:  # skipped before its key and names are made
        return RouteResult(
            kind=SKIPPED,
            idempotency_key=None,
            event=envelope,
            reason=eligibility.reason,
            task_id=task_id,
            eligibility=eligibility.to_dict(),
            dry_run=options.dry_run,
            task=_task(task_id, data, eligibility.tags, raw_path),
        )
    # The key, and the PR review gate's skip (docs/upstream.md §3.2.11).
    gate = todos_review_key(
        envelope, task_id, _task(task_id, data, eligibility.tags, raw_path), options
    )
    if gate.skipped is not None:
        return gate.skipped
    key = gate.key
    workflow_name, loop_name = todos_task_names(options.name_prefix, task_id, key)
    return EventView(
        envelope=envelope,
        route_key=TODOS_TASK,
        is_task=True,
        raw_path=raw_path,
        key=key,
        workflow_name=workflow_name,
        loop_name=loop_name,
        seed=task_id,
        subject_ref=task_id,
        title=task_field(data, "title"),
        body=task_field(data, "description"),
        task_id=task_id,
        tags=tuple(eligibility.tags),
        pr_review_routing=gate.routing,
    )


def _task(
    task_id: str | None,
    data: Mapping[str, Any],
    tags: Sequence[str],
    project_path: str | None,
) -> dict[str, Any]:
    """The todos task as results report it (id, title, description, tags, project path)."""
    return {
        "id": task_id,
        "title": task_field(data, "title"),
        "description": task_field(data, "description"),
        "tags": list(tags),
        "projectPath": project_path,
    }


def _generic_view(envelope: Envelope, options: RouteOptions) -> EventView:
    data = dict(envelope.data)
    source, event_type, event_id = envelope.source, envelope.type, envelope.id
    workflow_name, loop_name = generic_names(
        options.name_prefix, source, event_type, event_id
    )
    return EventView(
        envelope=envelope,
        route_key=GENERIC_EVENT,
        is_task=False,
        raw_path=generic_project_path_hint(
            envelope.data, envelope.metadata, option=options.project_path
        ),
        key=generic_event_key(source, event_type, event_id),
        workflow_name=workflow_name,
        loop_name=loop_name,
        seed=generic_pool_seed(source, event_type, event_id),
        subject_ref=envelope.subject or event_id,
        title=first_string(data, ("title", "summary")),
        body=first_string(data, ("message", "description", "body")),
    )


def invocation_fields(
    view: EventView,
    *,
    template_id: str,
    project_path: str,
    project_group: str | None,
    scope: str,
    options: RouteOptions,
    accounts: RouteAccounts,
) -> dict[str, Any]:
    """The invocation row's fields for this route (docs/upstream.md §3.2.12)."""
    envelope = view.envelope
    subject = view.subject(project_path)
    source: Mapping[str, Any] = {
        "kind": "event",
        "id": envelope.id,
        "dedupeKey": view.key,
        "raw": view.raw_source(),
    }
    return {
        "template_id": template_id,
        "source_id": envelope.id,
        "source_json": dict(source),
        "subject_kind": subject["kind"],
        "subject_id": subject["id"],
        "subject_path": project_path,
        "subject_json": subject,
        "intent": "route",
        "scope_json": {
            "projectPath": project_path,
            "projectGroup": project_group,
            "worktreePolicy": options.worktree_mode,
            "permissions": "bypass",
            "manualBreakGlass": options.manual_break_glass,
            "sandbox": options.sandbox,
            "accountPolicy": accounts.policy,
            "providerRouting": {
                "provider": accounts.provider,
                "pool": list(accounts.pool),
                "poolRouting": accounts.pool_active,
            },
            **(
                {"prReviewRouting": view.pr_review_routing}
                if view.pr_review_routing
                else {}
            ),
            "concurrencyGroup": project_group or project_path,
            "routeScope": scope,
            "routeThrottle": {
                **options.limits.to_dict(),
                "maxPerProfile": accounts.max_per_profile,
            },
        },
        "output_policy_json": {"report": "always", "createTask": "on_failure"},
    }
