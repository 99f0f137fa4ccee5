"""PR-review freshness (docs/upstream.md §3.2.11, docs/delivery.md §6): the PR's head.

A todos task the PR review gate applies to (domain.review) may name the head it was made
for (a ``head_sha`` / ``headSha`` / ``pr_head_sha`` / ``prHeadSha`` field, or
``head_sha=<sha>`` in its title or description). When the forge's head is another, the
PR is reviewed again: the task's key names the new head, so it is a new item (a loopsweb
addition; upstream has no head check). Merged and closed PRs: domain.review.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from domain.events import task_field

HEAD_KEYS = ("head_sha", "headSha", "pr_head_sha", "prHeadSha")
_TEXT_KEYS = ("title", "description")
_HEAD_WORD = re.compile(r"\bhead_sha\s*[=:]\s*([0-9a-fA-F]{7,64})\b")
_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")


def task_head(data: Mapping[str, Any]) -> str | None:
    """The PR head the task was made for (a field, or `head_sha=` in its text), lower case."""
    field = task_field(dict(data), *HEAD_KEYS)
    if field and _SHA.match(field.strip()):
        return field.strip().lower()
    for key in _TEXT_KEYS:
        text = task_field(dict(data), key)
        found = _HEAD_WORD.search(text) if text else None
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
