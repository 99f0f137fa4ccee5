"""Route keys, idempotency keys and generated names (docs/upstream.md §3.2.7-8, generic kind).

Contract:
1. Route kinds ``todos-task`` and ``generic`` map to route keys ``todos-task`` and
   ``generic-event``; anything else is a ``ValidationError``.
2. todos-task key: ``todos-task:pr:<fingerprint>`` when a PR fingerprint is known, else
   ``todos-task:<source project path>:<task id>`` for registry drains, else
   ``todos-task:<task id>``. Generic key: ``generic-event:<source>:<type>:<id>``.
3. A PR fingerprint is lowercase ``owner/repo#number``, from an explicit
   ``pr_fingerprint`` / ``prFingerprint`` field or the first canonical GitHub pull URL
   or ``github-pr:owner/repo#n`` handle found in the task's title, description or URL
   fields.
4. Names carry ``key_suffix`` (first 12 hex of sha256 of the key) so two keys never
   share a workflow or loop name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from domain.errors import ROUTE_KIND_INVALID, ValidationError
from domain.events import task_field

TODOS_TASK = "todos-task"
GENERIC_EVENT = "generic-event"
ROUTE_KEYS: tuple[str, ...] = (TODOS_TASK, GENERIC_EVENT)
# The route kinds a command or the API names (`route_event KIND`, `drain KIND`, `kind=`).
KINDS = ("todos-task", "generic")

KIND_TODOS_TASK = "todos-task"
KIND_GENERIC = "generic"

DEFAULT_TODOS_PREFIX = "event:todos-task"
DEFAULT_GENERIC_PREFIX = "event:generic"

SLUG_MAX = 80

PR_FINGERPRINT_KEYS: tuple[str, ...] = ("pr_fingerprint", "prFingerprint")
PR_TEXT_KEYS: tuple[str, ...] = (
    "title",
    "description",
    "url",
    "pr_url",
    "prUrl",
    "pull_request_url",
    "pullRequestUrl",
)

# GitHub owners are [A-Za-z0-9-]; repos also allow "." and "_". The lookbehind keeps
# "xhttps://github.com/..." or "my-github-pr:..." from matching inside another token.
_OWNER = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_REPO = r"[A-Za-z0-9._-]+"
_PR_URL = re.compile(
    rf"(?<![\w/.-])https://github\.com/(?P<owner>{_OWNER})/(?P<repo>{_REPO})"
    r"/pull/(?P<number>\d+)(?!\d)",
    re.IGNORECASE,
)
_PR_HANDLE = re.compile(
    rf"(?<![\w.-])github-pr:(?P<owner>{_OWNER})/(?P<repo>{_REPO})#(?P<number>\d+)(?!\d)",
    re.IGNORECASE,
)
_PR_BARE = re.compile(rf"^(?P<owner>{_OWNER})/(?P<repo>{_REPO})#(?P<number>\d+)$")
_SLUG_OTHER = re.compile(r"[^a-z0-9._:-]+")


def route_key_for_kind(kind: str) -> str:
    if kind == KIND_TODOS_TASK:
        return TODOS_TASK
    if kind == KIND_GENERIC:
        return GENERIC_EVENT
    raise ValidationError(ROUTE_KIND_INVALID)


def _fingerprint(match: re.Match[str]) -> str:
    # int() drops leading zeros so "#007" and "#7" are the same PR.
    return f"{match['owner']}/{match['repo']}#{int(match['number'])}".lower()


def parse_pr_reference(text: str) -> str | None:
    """Fingerprint of the first PR URL or ``github-pr:`` handle in ``text``."""
    found = [m for m in (_PR_URL.search(text), _PR_HANDLE.search(text)) if m]
    if not found:
        return None
    return _fingerprint(min(found, key=lambda m: m.start()))


def pr_fingerprint_from_task(data: Mapping[str, Any]) -> str | None:
    record = dict(data)
    explicit = task_field(record, *PR_FINGERPRINT_KEYS)
    if explicit is not None:
        bare = _PR_BARE.match(explicit)
        if bare:
            return _fingerprint(bare)
        # An explicit field is the producer's word: canonicalize it when it is a URL
        # or handle, otherwise use it verbatim (lowercased) as the fingerprint.
        return parse_pr_reference(explicit) or explicit.lower()
    for key in PR_TEXT_KEYS:
        text = task_field(record, key)
        if text is not None:
            fingerprint = parse_pr_reference(text)
            if fingerprint is not None:
                return fingerprint
    return None


def todos_task_key(
    task_id: str,
    *,
    pr_fingerprint: str | None = None,
    source_project_path: str | None = None,
) -> str:
    """Idempotency key for a todos task; ``source_project_path`` must be normalized."""
    if pr_fingerprint:
        return f"{TODOS_TASK}:pr:{pr_fingerprint}"
    if source_project_path:
        return f"{TODOS_TASK}:{source_project_path}:{task_id}"
    return f"{TODOS_TASK}:{task_id}"


def generic_event_key(source: str, type: str, id: str) -> str:
    return f"{GENERIC_EVENT}:{source}:{type}:{id}"


def key_suffix(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def slug(value: str, fallback: str) -> str:
    """Lowercase; runs outside ``[a-z0-9._:-]`` become ``-``; one edge ``-`` stripped.

    Truncated to 80 characters; empty results fall back to ``fallback``.
    """
    text = _SLUG_OTHER.sub("-", value.lower())
    # Upstream strips exactly one leading and one trailing "-" (/^-|-$/g), not all.
    if text.startswith("-"):
        text = text[1:]
    if text.endswith("-"):
        text = text[:-1]
    return text[:SLUG_MAX] or fallback


def _prefix(prefix: str | None, default: str) -> str:
    return prefix.strip() if prefix and prefix.strip() else default


def todos_task_names(prefix: str | None, task_id: str, key: str) -> tuple[str, str]:
    """(workflow name, loop name) for a todos-task route."""
    stem = f"{_prefix(prefix, DEFAULT_TODOS_PREFIX)}:{task_id[:8]}:{key_suffix(key)}"
    return f"{stem}:workflow", f"{stem}:run"


def generic_names(
    prefix: str | None, source: str, type: str, id: str
) -> tuple[str, str]:
    """(workflow name, loop name) for a generic route.

    loopsweb: upstream's stem ends at the id's first 8 characters, so events whose ids
    share them (`deploy-2026-12-07-…`) get one name, and admission takes its one-at-a-time
    path for them (the previous spec archived each time). A suffix of the event's key, as a
    todos task's names carry, makes the name unique per event and still the same for the
    same event."""
    stem = ":".join(
        (
            _prefix(prefix, DEFAULT_GENERIC_PREFIX),
            slug(source, "source"),
            slug(type, "type"),
            id[:8],
            key_suffix(generic_event_key(source, type, id)),
        )
    )
    return f"{stem}:workflow", f"{stem}:run"


def generic_pool_seed(source: str, type: str, id: str) -> str:
    return f"{source}:{type}:{id}"
