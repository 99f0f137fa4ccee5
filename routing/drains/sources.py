"""Where drains find work: the inbox, or an external command that prints tasks.

Both yield `Candidate`s: an envelope to route plus what fair dispatch and filters need.
The inbox is scanned for light tuples (id, project, attempt counter) and envelopes are loaded
only for the candidates a drain considers, so a drain scanning a large inbox keeps a small,
bounded memory footprint.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from domain.errors import ApplicationError, ValidationError
from domain.events import (
    Envelope,
    drained_task_path,
    generic_project_path_hint,
    parse_envelope,
    record_tags,
    with_route_path,
)
from domain.jsontext import loads_limited
from domain.keys import TODOS_TASK
from routing.models import OPEN_INBOX_STATES, InboxEvent
from runs.projects import repository_checkout

TODOS_EVENT_PREFIX = "task."
COMMAND_SOURCE = "command"
INBOX_SOURCE = "inbox"


@dataclass(frozen=True, slots=True)
class Candidate:
    # None for an inbox row as scanned: the drain loads envelopes only for the candidates it
    # considers (load_envelopes), so a wide scan holds light tuples, not payloads.
    envelope: Envelope | None
    project: str  # round-robin key ("" when the event names no project)
    tags: tuple[str, ...]
    inbox_id: str | None = None
    # The inbox row's attempt counter as scanned: a drain claims the row by bumping it.
    route_attempts: int = 0
    # The row's state and reason as scanned: a hold that changes nothing writes nothing.
    state: str = ""
    reason_code: str | None = None
    last_reason: str | None = None

    def recorded_as(self, state: str, reason_code: str, reason: str) -> bool:
        return (self.state, self.reason_code, self.last_reason) == (
            state,
            reason_code,
            reason,
        )


def _inbox_queryset(route_key: str) -> Any:
    rows = InboxEvent.objects.filter(state__in=OPEN_INBOX_STATES)
    # todos-task drains take task events; generic drains take every other event type.
    if route_key == TODOS_TASK:
        rows = rows.filter(event_type__startswith=TODOS_EVENT_PREFIX)
    else:
        rows = rows.exclude(event_type__startswith=TODOS_EVENT_PREFIX)
    return rows.order_by("received_at", "id")


def scan_inbox(
    *, route_key: str, scan_limit: int, with_tags: bool = False
) -> Iterator[Candidate]:
    """Open inbox events (pending or deferred), oldest first, at most scan_limit of them.

    Served by the partial index idx_inbox_open_received. Yields light candidates (no
    envelope, only the row's routing columns); `data` is read only `with_tags` (a tag
    filter needs it), and then dropped.
    """
    columns = ["id", "project_hint", "route_attempts", "state", "reason_code"]
    columns += ["last_reason"] + (["data"] if with_tags else [])
    rows = _inbox_queryset(route_key)[:scan_limit].values_list(*columns)
    for row in rows.iterator(chunk_size=2000):
        yield Candidate(
            envelope=None,
            project=row[1] or "",
            tags=tuple(record_tags(row[6])) if with_tags else (),
            inbox_id=row[0],
            route_attempts=row[2],
            state=row[3],
            reason_code=row[4],
            last_reason=row[5],
        )


def candidate_project(envelope: Envelope, *, task: bool) -> str | None:
    """The project a drain files a candidate under, un-normalized (its path prefix filter
    and round-robin key): a todos task's in upstream's drain order (docs/upstream.md §5.1,
    domain/events.py, "a drained todos task's project"), a generic event's as its route reads it."""
    if task:
        return drained_task_path(
            envelope.data, envelope.metadata, find_checkout=repository_checkout
        )
    return generic_project_path_hint(envelope.data, envelope.metadata, option=None)


def drained_envelope(envelope: Envelope, *, task: bool) -> Envelope:
    """The envelope a drain routes: a todos task routed to the project its filter read
    (docs/upstream.md §5.2.1: the drained event's route path fields), a generic event as
    it is."""
    if not task:
        return envelope
    return with_route_path(envelope, candidate_project(envelope, task=True))


def inbox_envelope(row: InboxEvent) -> Envelope:
    return Envelope(
        id=row.event_id,
        type=row.event_type,
        source=row.source,
        subject=row.subject,
        time=row.event_time,
        data=row.data,
        metadata=row.metadata,
        raw=row.envelope(),
    )


def load_envelopes(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates with their envelopes, in order: one query for the inbox rows.

    A row deleted since the scan drops out.
    """
    wanted = [c.inbox_id for c in candidates if c.envelope is None and c.inbox_id]
    rows = InboxEvent.objects.in_bulk(wanted) if wanted else {}
    loaded: list[Candidate] = []
    for candidate in candidates:
        if candidate.envelope is not None:
            loaded.append(candidate)
        elif candidate.inbox_id in rows:
            envelope = inbox_envelope(rows[candidate.inbox_id])
            task = envelope.type.startswith(TODOS_EVENT_PREFIX)
            envelope = drained_envelope(envelope, task=task)
            loaded.append(replace(candidate, envelope=envelope))
    return loaded


class SourceCommandError(ApplicationError):
    pass


def run_source_command(
    command: str | Sequence[str],
    *,
    timeout: float,
    max_bytes: int,
    cwd: str | None = None,
) -> list[Any]:
    """Run the operator's source command as argv (no shell) and parse its JSON array.

    The command comes from drain configuration, never from an event. Output beyond
    max_bytes or a run beyond timeout kills the process group and fails the drain's scan.
    """
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise ValidationError("--source-command is empty")
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise SourceCommandError(
            f"source command failed to start: {argv[0]}: {exc.strerror}"
        ) from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SourceCommandError(
            f"source command timed out after {timeout:g}s: {argv[0]}"
        ) from None
    if len(out) > max_bytes:
        raise SourceCommandError(
            f"source command printed more than {max_bytes} bytes: {argv[0]}"
        )
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip()[-300:]
        raise SourceCommandError(
            f"source command exited {proc.returncode}: {argv[0]}: {tail}"
        )
    try:
        # Depth-checked before parsing: hostile output cannot exhaust the parser's recursion.
        value = loads_limited(
            out, max_depth=settings.LOOPSWEB_MAX_JSON_DEPTH, array_wrapper=True
        )
    except ValidationError as exc:
        raise SourceCommandError(
            f"source command output is not acceptable JSON: {exc}"
        ) from None
    if not isinstance(value, list):
        raise SourceCommandError("source command must print a JSON array")
    return value


def task_envelope(task: Any) -> dict[str, Any]:
    """Synthesize the drain event for a `todos --json ready` task (docs/upstream.md §5.2)."""
    if not isinstance(task, dict):
        raise ValidationError("source task must be a JSON object")
    task_id = task.get("id") or task.get("task_id") or task.get("taskId")
    if not isinstance(task_id, str) or not task_id.strip():
        raise ValidationError("source task is missing its id")
    return {
        "id": f"drain-todos-task-{task_id}",
        "type": "task.created",
        "source": "@hasna/todos",
        "subject": task_id,
        "data": task,
        "metadata": {"drained_by": "loopsweb", "drained_from": "todos ready"},
    }


def scan_command(
    *, route_key: str, tasks: list[Any], scan_limit: int
) -> Iterator[Candidate | ApplicationError]:
    """Candidates from a source command's output: tasks for todos-task, envelopes otherwise.

    A malformed entry is yielded as its error so the drain records it and continues.
    """
    for raw in tasks[:scan_limit]:
        try:
            envelope = parse_envelope(
                task_envelope(raw) if route_key == TODOS_TASK else raw
            )
        except ApplicationError as exc:
            yield exc
            continue
        task = route_key == TODOS_TASK
        project = candidate_project(envelope, task=task)
        yield Candidate(
            envelope=drained_envelope(envelope, task=task),
            project=project or "",
            tags=tuple(record_tags(envelope.data)),
        )
