"""The PR review gate of a todos task (docs/upstream.md §3.2.11, docs/delivery.md §6).

The task side is domain.review: whether the gate applies (a PR reference and review or
merge intent in the task's text and fields), the PR state and author the task states, and
its reviewers. Here the forge is asked (`GET /repos/{owner}/{repo}/pulls/{number}`,
runs.github) when LOOPSWEB_GITHUB_TOKEN_FILE is set and the task names the PR (a pull
URL or github-pr handle), each answer cached for LOOPSWEB_PR_STATE_CACHE_SECONDS:

- the state: the forge's, else (no forge, or no answer) the one the task states. Merged or
  closed: `skipped` with upstream's reason, `routeError: true`, `prReviewRouting`,
  `freshnessSkip: true` and `prState` (`MERGED` / `CLOSED`); nothing is written.
- the author: the task's, else the forge's (the PR's `user`).
- a reviewer who is not the author, from `--github-reviewer` and the task: none is a
  `skipped` route error with the reason (no author, no reviewer, self-review).
- open, its head moved since the task was made (the task names the head it was made for):
  the task's key names the new head, so it is a new item and the PR is reviewed again.

Admitted, the result carries `prReviewRouting` (upstream's decision: `required`,
`allowed`, `author`, `reviewers`, `selectedReviewer`, `signals`; and the PR: `pr`, `repo`,
`number`, `head`, `prState`, `source`), as do the invocation's `scope_json` and the API's
work item (docs/upstream.md §3.8, §3.9). A task the gate does not apply to has none.

The gate is decided while planning, outside any transaction (a forge call never holds the
admission lock); a deviation from upstream's order, where it comes after the early dedupe
and the worktree check: a review task for a PR merged since it was admitted is skipped, not
deduped.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from domain.events import Envelope
from domain.freshness import head_moved, review_key, task_head
from domain.keys import pr_fingerprint_from_task, todos_task_key
from domain.review import (
    CLOSED_STATES,
    FRESHNESS_SKIP,
    ReviewEvidence,
    github_login,
    review_evidence,
    reviewer_decision,
)
from routing.admission.results import SKIPPED, RouteResult
from runs.github import ForgeError, get_pull_request


@dataclass(frozen=True)
class ForgePr:
    """What the forge said of the PR: its state (upper case), head and author."""

    state: str
    head: str | None
    author: str | None


_cache: dict[str, tuple[float, ForgePr]] = {}
_lock = threading.Lock()


def _forge_pr(reference: str) -> ForgePr | None:
    """The PR `owner/repo#n` as the forge answers (cached), or None without an answer."""
    if not settings.LOOPSWEB_GITHUB_TOKEN_FILE:
        return None
    now = time.monotonic()
    with _lock:
        cached = _cache.get(reference)
    if cached is not None and cached[0] > now:
        return cached[1]
    repo, _, number = reference.partition("#")
    if not number.isdigit() or repo.count("/") != 1:
        return None
    try:
        pr = get_pull_request(repo, int(number))
    except ForgeError:
        return None
    answer = ForgePr(pr.state.upper(), pr.head_sha, github_login(pr.author))
    with _lock:
        _cache[reference] = (now + settings.LOOPSWEB_PR_STATE_CACHE_SECONDS, answer)
    return answer


@dataclass(frozen=True)
class Gate:
    """What the gate decided: the key to admit under, its skipped result or None, and the
    `prReviewRouting` it read (None: the gate did not apply)."""

    key: str
    skipped: RouteResult | None = None
    routing: dict[str, Any] | None = None


def forget_pr_states() -> None:
    """Empty the cache (tests, and an operator's `routes` retry after a merge)."""
    with _lock:
        _cache.clear()


def todos_review_key(
    envelope: Envelope,
    task_id: str,
    task: dict[str, Any] | None,
    options: Any,
) -> Gate:
    """The todos task's idempotency key (docs/upstream.md §3.2.7) through the gate
    (`options`: RouteOptions)."""
    fingerprint = pr_fingerprint_from_task(envelope.data)
    key = todos_task_key(task_id, pr_fingerprint=fingerprint)
    evidence = review_evidence(envelope.data, envelope.metadata)
    if not evidence.required:
        return Gate(key)
    return review_gate(
        envelope,
        evidence,
        key=key,
        reference=evidence.reference or _bare(fingerprint),
        task=task,
        reviewers=tuple(options.github_reviewer),
        dry_run=options.dry_run,
    )


def _bare(fingerprint: str | None) -> str | None:
    """The fingerprint when it names a PR (`owner/repo#n`), else None."""
    if fingerprint is None:
        return None
    repo, _, number = fingerprint.partition("#")
    return fingerprint if number.isdigit() and repo.count("/") == 1 else None


def _pr_fields(
    reference: str | None, forge: ForgePr | None, data: dict[str, Any], state: Any
) -> dict[str, Any]:
    repo, _, number = (reference or "").partition("#")
    return {
        "pr": reference,
        "repo": repo or None,
        "number": int(number) if number.isdigit() else None,
        "head": forge.head if forge is not None else task_head(data),
        "prState": state,
        "source": "forge" if forge is not None else "task",
    }


def review_gate(
    envelope: Envelope,
    evidence: ReviewEvidence,
    *,
    key: str,
    reference: str | None,
    task: dict[str, Any] | None,
    reviewers: tuple[str, ...],
    dry_run: bool,
) -> Gate:
    """The gate's decision for a task it applies to (module docstring)."""
    forge = _forge_pr(reference) if reference else None
    state = forge.state if forge is not None else evidence.stated_state
    signals = list(evidence.signals)
    routing: dict[str, Any] = {"required": True}
    if state in CLOSED_STATES:
        reason = FRESHNESS_SKIP.format(state=str(state).lower())
        routing |= {"allowed": False, "reason": reason, "reviewers": []}
        routing |= {"signals": [*signals, "pr-not-open"]}
        routing |= _pr_fields(reference, forge, envelope.data, state)
        extra = {"freshnessSkip": True, "prState": state}
        return Gate(
            key, _skipped(envelope, key, task, reason, routing, extra, dry_run), routing
        )
    author, author_source = evidence.author, "task"
    if author is None and forge is not None and forge.author is not None:
        author, author_source = forge.author, "forge"
        signals.append("author-derived-forge")
    decision = reviewer_decision(author, reviewers, evidence.reviewers)
    routing["allowed"] = decision.allowed
    if decision.reason is not None:
        routing["reason"] = decision.reason
    if author is not None:
        routing |= {"author": author, "authorSource": author_source}
    routing["reviewers"] = list(decision.reviewers)
    if decision.selected is not None:
        routing["selectedReviewer"] = decision.selected
    routing["signals"] = signals
    routing |= _pr_fields(reference, forge, envelope.data, state)
    if decision.reason is not None:
        skipped = _skipped(envelope, key, task, decision.reason, routing, {}, dry_run)
        return Gate(key, skipped, routing)
    if forge is not None and head_moved(task_head(envelope.data), forge.head):
        return Gate(review_key(key, str(forge.head)), None, routing)
    return Gate(key, None, routing)


def _skipped(
    envelope: Envelope,
    key: str,
    task: dict[str, Any] | None,
    reason: str,
    routing: dict[str, Any],
    extra: dict[str, Any],
    dry_run: bool,
) -> RouteResult:
    """The gate's skip: a route error carrying `prReviewRouting` (and `extra`)."""
    return RouteResult(
        kind=SKIPPED,
        idempotency_key=key,
        event=envelope,
        reason=reason,
        task_id=task["id"] if task else None,
        dry_run=dry_run,
        task=task,
        extra={"routeError": True, "prReviewRouting": routing, **extra},
    )
