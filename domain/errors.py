"""Domain errors for route admission.

Contract:
- Every error the domain raises is an ``ApplicationError``; bad caller input is the
  ``ValidationError`` subclass, which commands and the API turn into a one-line error
  that writes nothing.
- Messages are module-level constants so tests, services and docs quote one source.
  Constants containing ``{placeholders}`` are ``str.format`` templates; the wording
  follows OpenLoops 0.4.12 where upstream has a message.
"""

from __future__ import annotations

EVENT_NOT_OBJECT = "event JSON must be an object"
EVENT_INVALID_JSON = "event JSON is not valid JSON: {error}"
EVENT_ID_REQUIRED = "event.id is required"
EVENT_TYPE_REQUIRED = "event.type is required"
EVENT_SOURCE_REQUIRED = "event.source is required"

TODOS_TASK_ID_MISSING = (
    "todos task event is missing task id in data.id, data.task_id, "
    "data.task.id, or data.payload.id"
)

LIMIT_NOT_POSITIVE = "{flag} must be a positive integer"
LIMIT_NOT_NON_NEGATIVE = "{flag} must be a non-negative integer"

ROUTE_KIND_INVALID = "route kind must be todos-task or generic"
ROUTE_KEY_INVALID = "route key must be todos-task or generic-event: {route_key}"

TEMPLATE_INVALID_TODOS = "--template must be todos-task-worker-verifier or task-lifecycle for todos-task routes"
TEMPLATE_INVALID_GENERIC = "--template must be event-worker-verifier for generic routes"


class ApplicationError(Exception):
    """Base class of every error raised on purpose by loopsweb domain code."""


class ValidationError(ApplicationError):
    """The caller supplied input that cannot be routed (bad event, flag or option)."""
