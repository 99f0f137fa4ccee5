"""The PR review gate of a todos task (docs/upstream.md §3.2.11, docs/delivery.md §6).

A task with a PR fingerprint and a merge or approve intent (domain.freshness) has its PR
looked up before admission: through the forge (`GET /repos/{owner}/{repo}/pulls/{number}`,
ledger.github) when LOOPSWEB_GITHUB_TOKEN_FILE is set, each answer cached for
LOOPSWEB_PR_STATE_CACHE_SECONDS; else (or when the forge does not answer) the `pr_state=`
the task states, as upstream 0.4.12 reads it.

- merged or closed: `skipped` with `routeError: true`, `prReviewRouting`,
  `freshnessSkip: true` and `prState` (`MERGED` / `CLOSED`); nothing is written.
- otherwise admitted as any task, and `prReviewRouting` (the PR: `repo`, `number`, `pr`,
  `intent`, the `head` it was checked at, the `prState` read and its `source`, `forge` or
  `task`) goes on the result, in the invocation's `scope_json` and on the API's work item
  (docs/upstream.md §3.8, §3.9). A task the gate does not apply to has none.
- open, its head moved since the task was made (the task names the head it was made for):
  the task's key names the new head, so it is a new item and the PR is reviewed again.

The lookup is made while planning, outside any transaction (a forge call never holds the
admission lock); a deviation from upstream's order, where the gate comes after the early
dedupe: a review task for a PR merged since it was admitted is skipped, not deduped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from domain.events import Envelope
from domain.freshness import (
    head_moved,
    review_intent,
    review_key,
    stated_pr_state,
    task_head,
)
from domain.keys import pr_fingerprint_from_task, todos_task_key
from ledger.github import ForgeError, get_pull_request
from routing.admission.results import SKIPPED, RouteResult

FRESHNESS_SKIP = "pull request {pr} is {state}: nothing to {intent}"
_cache: dict[str, tuple[float, str, str | None]] = {}
_lock = threading.Lock()


def _forge_state(fingerprint: str) -> tuple[str, str | None] | None:
    """(STATE, head sha) of the PR from the forge (cached), or None without an answer."""
    if not settings.LOOPSWEB_GITHUB_TOKEN_FILE:
        return None
    now = time.monotonic()
    with _lock:
        cached = _cache.get(fingerprint)
    if cached is not None and cached[0] > now:
        return cached[1], cached[2]
    repo, _, number = fingerprint.partition("#")
    if not number.isdigit() or repo.count("/") != 1:
        return None
    try:
        pr = get_pull_request(repo, int(number))
    except ForgeError:
        return None
    state = pr.state.upper()
    with _lock:
        _cache[fingerprint] = (
            now + settings.LOOPSWEB_PR_STATE_CACHE_SECONDS,
            state,
            pr.head_sha,
        )
    return state, pr.head_sha


@dataclass(frozen=True)
class Gate:
    """What the gate decided: the key to admit under, its skipped result (merged or
    closed) or None, and the `prReviewRouting` it read (None: the gate did not apply)."""

    key: str
    skipped: RouteResult | None = None
    routing: dict[str, Any] | None = None


def forget_pr_states() -> None:
    """Empty the cache (tests, and an operator's `routes` retry after a merge)."""
    with _lock:
        _cache.clear()


def todos_review_key(
    data: Mapping[str, Any],
    tags: Sequence[str],
    task_id: str,
    envelope: Envelope,
    task: dict[str, Any] | None,
    options: Any,
) -> Gate:
    """The todos task's idempotency key (docs/upstream.md §3.2.7) through the gate
    (`options`: RouteOptions)."""
    fingerprint = pr_fingerprint_from_task(data)
    return review_gate(
        data,
        tags,
        key=todos_task_key(task_id, pr_fingerprint=fingerprint),
        fingerprint=fingerprint,
        envelope=envelope,
        task=task,
        dry_run=options.dry_run,
    )


def review_gate(
    data: Mapping[str, Any],
    tags: Sequence[str],
    *,
    key: str,
    fingerprint: str | None,
    envelope: Envelope,
    task: dict[str, Any] | None,
    dry_run: bool,
) -> Gate:
    """The gate's decision (module docstring)."""
    intent = review_intent(data, tuple(tags)) if fingerprint else None
    if fingerprint is None or intent is None:
        return Gate(key)
    answer = _forge_state(fingerprint)
    state, head = answer if answer is not None else (stated_pr_state(data), None)
    repo, _, number = fingerprint.partition("#")
    routing = {
        "pr": fingerprint,
        "repo": repo,
        "number": int(number) if number.isdigit() else None,
        "intent": intent,
        "head": head if answer is not None else task_head(data),
        "prState": state,
        "source": "forge" if answer is not None else "task",
    }
    if state in ("MERGED", "CLOSED"):
        result = RouteResult(
            kind=SKIPPED,
            idempotency_key=key,
            event=envelope,
            reason=FRESHNESS_SKIP.format(
                pr=fingerprint, state=state.lower(), intent=intent
            ),
            task_id=task["id"] if task else None,
            dry_run=dry_run,
            task=task,
            extra={
                "routeError": True,
                "prReviewRouting": routing,
                "freshnessSkip": True,
                "prState": state,
            },
        )
        return Gate(key, result, routing)
    if head is not None and head_moved(task_head(data), head):
        return Gate(review_key(key, head), None, routing)
    return Gate(key, None, routing)
