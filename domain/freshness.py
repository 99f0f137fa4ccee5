"""PR-review freshness (docs/upstream.md §3.2.11, docs/delivery.md §6): the task side.

A todos task that reviews a pull request (a PR fingerprint, domain.keys, and a merge or
approve intent) is gated before admission: a PR that is merged or closed gives a `skipped`
result with `freshnessSkip: true` and `prState`; a PR whose head moved since the task was
made is reviewed again against the new head (its key names the head).

This module reads the task: its intent, the PR state it states (`pr_state=MERGED` in its
text, as 0.4.12 reads it when no forge answers), and the head it was made for. What upstream
calls the intent is not in the reference; loopsweb reads it from, first to last: a field
`intent` / `prIntent` / `pr_intent`, a tag `intent:merge` / `intent:approve` (or `pr:merge` /
`pr:approve`), a `intent=merge` word in the title or description.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from domain.events import task_field

INTENTS = ("merge", "approve")
PR_STATES = ("OPEN", "MERGED", "CLOSED")
INTENT_KEYS = ("intent", "prIntent", "pr_intent")
HEAD_KEYS = ("head_sha", "headSha", "pr_head_sha", "prHeadSha")
_TEXT_KEYS = ("title", "description")
_STATE_WORD = re.compile(r"\bpr_state\s*[=:]\s*([A-Za-z]+)\b")
_INTENT_WORD = re.compile(r"\bintent\s*[=:]\s*(merge|approve)\b", re.IGNORECASE)
_HEAD_WORD = re.compile(r"\bhead_sha\s*[=:]\s*([0-9a-fA-F]{7,64})\b")
_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")


def _texts(data: Mapping[str, Any]) -> list[str]:
    return [t for t in (task_field(dict(data), key) for key in _TEXT_KEYS) if t]


def review_intent(
    data: Mapping[str, Any], tags: list[str] | tuple[str, ...]
) -> str | None:
    """`merge` or `approve` when the task asks for one (module docstring), else None."""
    field = task_field(dict(data), *INTENT_KEYS)
    if field and field.strip().lower() in INTENTS:
        return field.strip().lower()
    for tag in tags:
        name, _, value = str(tag).strip().lower().partition(":")
        if name in ("intent", "pr") and value in INTENTS:
            return value
    for text in _texts(data):
        found = _INTENT_WORD.search(text)
        if found:
            return found.group(1).lower()
    return None


def stated_pr_state(data: Mapping[str, Any]) -> str | None:
    """The PR state the task states (`pr_state=MERGED`), upper case, or None."""
    field = task_field(dict(data), "pr_state", "prState")
    candidates = [field] if field else []
    candidates += [
        m.group(1) for t in _texts(data) for m in [_STATE_WORD.search(t)] if m
    ]
    for value in candidates:
        if value.strip().upper() in PR_STATES:
            return value.strip().upper()
    return None


def task_head(data: Mapping[str, Any]) -> str | None:
    """The PR head the task was made for (a field, or `head_sha=` in its text), lower case."""
    field = task_field(dict(data), *HEAD_KEYS)
    if field and _SHA.match(field.strip()):
        return field.strip().lower()
    for text in _texts(data):
        found = _HEAD_WORD.search(text)
        if found:
            return found.group(1).lower()
    return None


def head_moved(made_for: str | None, now: str | None) -> bool:
    """Whether the PR's head (`now`, from the forge) is not the one the task was made for."""
    if not made_for or not now:
        return False
    short = min(len(made_for), len(now))
    return made_for[:short].lower() != now[:short].lower()


def review_key(key: str, head: str) -> str:
    """The idempotency key of a review of the PR at `head`: a new item per head."""
    return f"{key}@{head[:12].lower()}"
