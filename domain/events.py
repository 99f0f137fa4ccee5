"""Event envelopes and field lookups (docs/upstream.md §3.1, §3.2.3-4, generic paragraph).

Contract:
1. An envelope is a JSON object with non-blank string ``id``, ``type`` and ``source``;
   ``data`` and ``metadata`` become ``{}`` when they are not objects. Violations raise
   ``ValidationError`` with upstream's exact messages, checked in that order. An envelope
   holding a value no database can store (NUL, unpaired surrogates, NaN) is refused too
   (``domain.jsontext``), so bad input fails here instead of inside an INSERT.
2. ``task_field(record, *keys)``: for each key in turn, look in ``record``, then
   ``record.task``, ``record.payload``, ``record.payload.task``; the first non-blank
   string wins, trimmed. Non-strings never match.
3. Tags come from ``tags`` / ``task_tags`` / ``taskTags``, as arrays or comma-separated
   text, trimmed, blanks dropped, duplicates dropped (first occurrence kept).
4. Project path and group hints return raw text; normalizing a path (realpath, git
   top-level) touches the filesystem and belongs to the service.
5. **The ``Repository:`` line.** A todos task whose description has a
   ``Repository: <path or owner/repo>`` line (the first such line, the label
   case-insensitive) names its project there when no task or metadata path field does
   (docs/upstream.md §5.1): an absolute path as it is; an ``owner/repo`` name through the
   caller's ``find_checkout`` (the file system's business), and not at all without one.
6. A drained todos task's project (docs/upstream.md §5.1, the drains' path prefix filter
   and their route): the task's ``project_path`` / ``projectPath``; else its metadata's
   (the task's own ``metadata``, then the envelope's) ``project_path`` / ``projectPath`` /
   ``project_canonical_path``; else its ``Repository:`` line (above); else the task's
   ``working_dir`` / ``workingDir`` / ``cwd``; else the metadata's. The drain routes the task
   there: its envelope's ``data.route_project_path`` is set to it (the first field of the
   route's own order, docs/upstream.md §3.2.3), as upstream's drain sets the synthesized
   event's route path fields (docs/upstream.md §5.2.1).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from domain.controls import control_refused
from domain.errors import (
    EVENT_ID_REQUIRED,
    EVENT_INVALID_JSON,
    EVENT_NOT_OBJECT,
    EVENT_SOURCE_REQUIRED,
    EVENT_TYPE_REQUIRED,
    ValidationError,
)
from domain.jsontext import (
    DEFAULT_MAX_DEPTH,
    JsonSyntaxError,
    loads_limited,
    unstorable_reason,
)

TAG_KEYS: tuple[str, ...] = ("tags", "task_tags", "taskTags")

TODOS_DATA_PATH_KEYS: tuple[str, ...] = (
    "route_project_path",
    "routeProjectPath",
    "project_path",
    "projectPath",
    "working_dir",
    "workingDir",
    "cwd",
)
TODOS_METADATA_PATH_KEYS: tuple[str, ...] = (
    "working_dir",
    "workingDir",
    "project_path",
    "projectPath",
    "project_canonical_path",
    "cwd",
)
GENERIC_DATA_PATH_KEYS: tuple[str, ...] = (
    "working_dir",
    "workingDir",
    "project_path",
    "projectPath",
    "cwd",
    "repo_path",
    "repoPath",
)
GENERIC_METADATA_PATH_KEYS: tuple[str, ...] = (
    *GENERIC_DATA_PATH_KEYS,
    "project_canonical_path",
)
PROJECT_GROUP_KEYS: tuple[str, ...] = (
    "project_group",
    "projectGroup",
    "repo_group",
    "repoGroup",
    "workspace_group",
    "workspaceGroup",
)


@dataclass(frozen=True)
class Envelope:
    id: str
    type: str
    source: str
    subject: str | None = None
    time: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


def string_field(value: object) -> str | None:
    """``value`` trimmed when it is a non-blank string, else ``None``."""
    if isinstance(value, str):
        text = value.strip()
        return text or None
    return None


def object_field(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


TASK_ID_KEYS: tuple[str, ...] = ("id", "task_id", "taskId")


def _no_controls(what: str, value: str) -> None:
    """Ids, sources and types end up in names, keys and terminal lines: one holding a
    control character (an escape sequence, a newline) is refused where it enters."""
    refused = control_refused(what, value)
    if refused:
        raise ValidationError(refused)


def _required(obj: Mapping[str, Any], key: str, message: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(message)
    _no_controls(f"event.{key}", value)
    # Kept verbatim (not trimmed): ids feed idempotency keys, which must match what
    # upstream derived for the same delivery.
    return value


def parse_envelope(obj: object) -> Envelope:
    if not isinstance(obj, dict):
        raise ValidationError(EVENT_NOT_OBJECT)
    envelope = Envelope(
        id=_required(obj, "id", EVENT_ID_REQUIRED),
        type=_required(obj, "type", EVENT_TYPE_REQUIRED),
        source=_required(obj, "source", EVENT_SOURCE_REQUIRED),
        subject=string_field(obj.get("subject")),
        time=string_field(obj.get("time")),
        data=object_field(obj.get("data")) or {},
        metadata=object_field(obj.get("metadata")) or {},
        raw=obj,
    )
    task_id = task_field(envelope.data, *TASK_ID_KEYS)
    if task_id is not None:
        _no_controls("the task id", task_id)
    unstorable = unstorable_reason(obj)
    if unstorable:
        raise ValidationError(f"event JSON cannot be stored: {unstorable}")
    return envelope


def load_envelope(text: str, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Envelope:
    """Parse envelope JSON text; invalid JSON is a ``ValidationError`` like any bad input."""
    try:
        obj = loads_limited(text, max_depth=max_depth)
    except JsonSyntaxError as exc:
        raise ValidationError(EVENT_INVALID_JSON.format(error=exc.error)) from None
    except ValidationError as exc:  # too deep, NaN, unstorable strings
        raise ValidationError(f"event JSON is refused: {exc}") from None
    return parse_envelope(obj)


def _task_locations(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    payload = object_field(record.get("payload"))
    candidates: list[object] = [
        record,
        record.get("task"),
        payload,
        payload.get("task") if payload is not None else None,
    ]
    return [c for c in candidates if isinstance(c, dict)]


def task_field(record: object, *keys: str) -> str | None:
    if not isinstance(record, dict):
        return None
    locations = _task_locations(record)
    for key in keys:
        for location in locations:
            value = string_field(location.get(key))
            if value is not None:
                return value
    return None


def first_string(record: object, keys: Iterable[str]) -> str | None:
    """First non-blank string among ``keys`` directly on ``record`` (no nesting)."""
    if not isinstance(record, dict):
        return None
    for key in keys:
        value = string_field(record.get(key))
        if value is not None:
            return value
    return None


def _split_tags(value: object) -> list[str]:
    if isinstance(value, str):
        parts: Iterable[object] = value.split(",")
    elif isinstance(value, list):
        parts = value
    else:
        return []
    return [tag for tag in (string_field(p) for p in parts) if tag is not None]


def record_tags(record: object) -> list[str]:
    if not isinstance(record, dict):
        return []
    tags: list[str] = []
    for key in TAG_KEYS:
        for tag in _split_tags(record.get(key)):
            if tag not in tags:
                tags.append(tag)
    return tags


_REPOSITORY_LINE = re.compile(
    r"^[ \t>*-]*repository:[ \t]*(\S[^\r\n]*?)[ \t]*$", re.I | re.M
)
_OWNER_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")

FindCheckout = Callable[[str], str | None]
"""Maps an ``owner/repo`` name to the project directory that holds its checkout, or None."""


def description_repository(description: object) -> str | None:
    """The value of the first ``Repository:`` line of a task description, trimmed (a
    trailing ``.git`` and ``/`` dropped), or None."""
    if not isinstance(description, str):
        return None
    match = _REPOSITORY_LINE.search(description)
    if match is None:
        return None
    value = match.group(1).strip().strip("`").strip().rstrip("/")
    if value.endswith(".git"):
        value = value[: -len(".git")]
    return value.rstrip("/") or None


def repository_path_hint(
    data: Mapping[str, Any], *, find_checkout: FindCheckout | None = None
) -> str | None:
    """The project path a todos task's ``Repository:`` line names (module docstring, "the
    ``Repository:`` line"), or None."""
    value = description_repository(task_field(dict(data), "description"))
    if value is None:
        return None
    if value.startswith("/"):
        return value
    for prefix in ("https://github.com/", "http://github.com/", "github.com/"):
        if value.lower().startswith(prefix):
            value = value[len(prefix) :]
    if _OWNER_REPO.match(value) and ".." not in value.split("/"):
        return find_checkout(value) if find_checkout is not None else None
    return None


def todos_project_path_hint(
    data: Mapping[str, Any],
    metadata: Mapping[str, Any],
    *,
    option: str | None,
    cwd: str | None = None,
    find_checkout: FindCheckout | None = None,
) -> str | None:
    """Un-normalized project path for a todos-task route (0.4.11/0.4.12 precedence).

    Task fields first, then envelope metadata, then the description's ``Repository:`` line
    (module docstring), then ``--project-path``, then ``cwd`` (upstream's process directory;
    admission passes none, so a route never lands in the directory of whatever process
    routed it).
    """
    return (
        task_field(dict(data), *TODOS_DATA_PATH_KEYS)
        or first_string(dict(metadata), TODOS_METADATA_PATH_KEYS)
        or repository_path_hint(data, find_checkout=find_checkout)
        or string_field(option)
        or cwd
        or None
    )


def generic_project_path_hint(
    data: Mapping[str, Any],
    metadata: Mapping[str, Any],
    *,
    option: str | None,
    cwd: str | None = None,
) -> str | None:
    """Un-normalized project path for a generic route: option, data, metadata, cwd (see
    ``todos_project_path_hint`` on the cwd)."""
    return (
        string_field(option)
        or first_string(dict(data), GENERIC_DATA_PATH_KEYS)
        or first_string(dict(metadata), GENERIC_METADATA_PATH_KEYS)
        or cwd
        or None
    )


def project_group_hint(
    data: Mapping[str, Any], metadata: Mapping[str, Any], *, option: str | None
) -> str | None:
    """``--project-group`` (trimmed), else the first group field in data, then metadata."""
    return (
        string_field(option)
        or task_field(dict(data), *PROJECT_GROUP_KEYS)
        or first_string(dict(metadata), PROJECT_GROUP_KEYS)
    )


DRAINED_PATH_KEYS: tuple[str, ...] = ("project_path", "projectPath")
DRAINED_METADATA_PATH_KEYS: tuple[str, ...] = (
    "project_path",
    "projectPath",
    "project_canonical_path",
)
DRAINED_WORKING_DIR_KEYS: tuple[str, ...] = ("working_dir", "workingDir", "cwd")
ROUTE_PATH_KEY = "route_project_path"


def drained_task_path(
    data: Mapping[str, Any],
    metadata: Mapping[str, Any],
    *,
    find_checkout: FindCheckout | None = None,
) -> str | None:
    """The project of a drained todos task, un-normalized (module docstring, "a drained
    todos task's project"), or None."""
    record = dict(data)
    metadatas = [m for m in (object_field(record.get("metadata")), dict(metadata)) if m]

    def from_metadata(keys: tuple[str, ...]) -> str | None:
        for found in (first_string(m, keys) for m in metadatas):
            if found is not None:
                return found
        return None

    return (
        task_field(record, *DRAINED_PATH_KEYS)
        or from_metadata(DRAINED_METADATA_PATH_KEYS)
        or repository_path_hint(record, find_checkout=find_checkout)
        or task_field(record, *DRAINED_WORKING_DIR_KEYS)
        or from_metadata(DRAINED_WORKING_DIR_KEYS)
    )


def with_route_path(envelope: Envelope, path: str | None) -> Envelope:
    """`envelope` routed to `path` (module docstring, "a drained todos task's project"): its
    ``data.route_project_path`` set, in its raw envelope too (a retry replays the route the
    drain took); unchanged without a path."""
    if path is None or envelope.data.get(ROUTE_PATH_KEY) == path:
        return envelope
    data = {**envelope.data, ROUTE_PATH_KEY: path}
    raw = {**envelope.raw, "data": data} if envelope.raw else envelope.raw
    return replace(envelope, data=data, raw=raw)
