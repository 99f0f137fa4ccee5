"""The PR review gate's task side (docs/upstream.md §3.2.11, domain.review):
when it applies, what the task says of the PR's state, author and reviewers, and the
reviewer decision with upstream's reasons. Through route_event and the drain:
tests/routing/test_upstream_gate_paths.py."""

from __future__ import annotations

from typing import Any

import pytest

from domain.review import (
    AUTHOR_MISSING,
    FRESHNESS_SKIP,
    REVIEWER_MISSING,
    SELF_REVIEW,
    review_evidence,
    reviewer_decision,
)

URL = "https://github.com/acme/app/pull/9"


def _task(**fields: Any) -> dict[str, Any]:
    return {"id": "t-1", "tags": ["auto:route"], **fields}


# --- when the gate applies: a PR reference and review or merge intent ---------------------------

APPLIES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "the issue's task",
        _task(title="Review and merge acme/app#9", description=f"please merge {URL}"),
        ["pr-approval-intent"],
    ),
    (
        "a github-pr handle",
        _task(title="Approve github-pr:acme/app#9"),
        ["pr-approval-intent"],
    ),
    (
        "the words pull request",
        _task(title="Merge the pull request"),
        ["pr-approval-intent"],
    ),
    ("PR #N", _task(title="approval needed for PR #12"), ["pr-approval-intent"]),
    ("PR N", _task(description="please review pr 12"), ["pr-approval-intent"]),
    (
        "a truthy review-required field",
        _task(title="PR #3 is waiting", metadata={"reviewRequired": "true"}),
        ["review-required-field"],
    ),
    (
        "reviewDecision=REVIEW_REQUIRED",
        _task(title="PR #3", description="reviewDecision=REVIEW_REQUIRED"),
        ["review-required-text"],
    ),
    (
        "a reviewDecision field",
        _task(title="PR #3", review_decision="REVIEW_REQUIRED"),
        ["review-required-text"],
    ),
    (
        "requires N approving reviews",
        _task(title=f"{URL}: requires 2 approving reviews"),
        ["review-required-text"],
    ),
    (
        "branch protection wording",
        _task(
            title="PR #3",
            description="Branch protection on main wants an approving review first.",
        ),
        ["review-required-text", "pr-approval-intent"],  # "review" is a word of it
    ),
    (
        "mergeStateStatus=BLOCKED",
        _task(title="PR #3", description="mergeStateStatus: BLOCKED"),
        ["merge-blocked-text"],
    ),
    (
        "the intent in a tag",
        _task(title=f"Look at {URL}", tags=["auto:route", "pr:merge"]),
        ["pr-approval-intent"],
    ),
]


@pytest.mark.parametrize(
    ("case", "data", "signals"), APPLIES, ids=[c[0] for c in APPLIES]
)
def test_the_gate_applies_to_a_pr_reference_with_review_or_merge_intent(
    case: str, data: dict[str, Any], signals: list[str]
) -> None:
    evidence = review_evidence(data, {})
    assert evidence.required is True, case
    assert list(evidence.signals) == signals, case


DOES_NOT_APPLY: list[tuple[str, dict[str, Any]]] = [
    ("no PR reference", _task(title="Review the README and merge the sections")),
    ("a PR and no intent", _task(title=f"Look at {URL}")),
    ("an intent field only", _task(title=f"Look at {URL}", intent="merge-ish")),
    ("a word inside another", _task(title="PR #4 reviewer notes; merged-up")),
    ("a task id is no PR number", _task(title="merge sprint 12", id="pr12x")),
]


@pytest.mark.parametrize(
    ("case", "data"), DOES_NOT_APPLY, ids=[c[0] for c in DOES_NOT_APPLY]
)
def test_the_gate_does_not_apply_without_both(case: str, data: dict[str, Any]) -> None:
    assert review_evidence(data, {}).required is False, case


def test_the_envelopes_metadata_and_automation_records_are_evidence_too() -> None:
    evidence = review_evidence(
        _task(title="Fix it"),
        {"automation": {"message": f"merge {URL}", "github_reviewer": "hubot"}},
    )
    assert evidence.required and evidence.reference == "acme/app#9"
    assert evidence.reviewers == ("hubot",)


# --- what the task says: the PR, its state, its author, its reviewers ---------------------------


@pytest.mark.parametrize(
    ("data", "reference"),
    [
        (_task(title=f"Review {URL}"), "acme/app#9"),
        (_task(title="Review github-pr:Acme/App#09"), "acme/app#9"),
        (_task(title="Review PR #9"), None),  # no repository: nothing to ask the forge
        (
            _task(title="Merge https://github.com/acme/../pull/9"),
            None,
        ),  # no path tricks
        (
            _task(title="Merge github-pr:acme/.#9 or github-pr:a/.github#2"),
            "a/.github#2",
        ),
    ],
)
def test_the_pr_the_gate_names(data: dict[str, Any], reference: str | None) -> None:
    assert review_evidence(data, {}).reference == reference


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({"description": "pr_state=MERGED"}, "MERGED"),
        ({"description": "pull request state: closed"}, "CLOSED"),
        ({"description": "state = OPEN"}, "OPEN"),
        ({"prState": "merged"}, "MERGED"),
        ({"metadata": {"pull_request_state": "CLOSED"}}, "CLOSED"),
        ({"pr_status": "open", "description": "pr_state=MERGED"}, "OPEN"),
        ({"description": "nothing said"}, None),
    ],
)
def test_the_state_the_task_states(fields: dict[str, Any], state: str | None) -> None:
    data = _task(title=f"Merge {URL}", **fields)
    assert review_evidence(data, {}).stated_state == state


@pytest.mark.parametrize(
    ("fields", "author"),
    [
        ({"pr_author": "@mona"}, "mona"),
        ({"metadata": {"githubAuthor": "Mona"}}, "Mona"),
        ({"description": "The author is mona."}, "mona"),
        ({"description": "PR #9 author = octo-cat"}, "octo-cat"),
        ({"description": "github author is also @hubot"}, "hubot"),
        ({"pr_author": "not a login!", "description": "author : mona"}, "mona"),
        ({"description": "author:mona"}, None),  # upstream's words need the spaces
        ({"description": "nobody said"}, None),
    ],
)
def test_the_author_the_task_names(fields: dict[str, Any], author: str | None) -> None:
    data = _task(title=f"Merge {URL}", **fields)
    assert review_evidence(data, {}).author == author


@pytest.mark.parametrize(
    ("fields", "reviewers"),
    [
        ({"github_reviewer": "hubot"}, ("hubot",)),
        ({"metadata": {"github_reviewer_pool": "a, @b ,A"}}, ("a", "b")),
        ({"reviewers": ["octo", "bad login!", "octo"]}, ("octo",)),
        ({"description": "GitHub reviewers: hubot, octo\nmore"}, ("hubot", "octo")),
        ({"description": "github reviewer pool = x1"}, ("x1",)),
        ({"description": "github reviewer is hubot"}, ("hubot",)),
        ({"merge_actor": "m", "description": "github reviewer: r"}, ("m", "r")),
        ({}, ()),
    ],
)
def test_the_reviewers_the_task_names(
    fields: dict[str, Any], reviewers: tuple[str, ...]
) -> None:
    data = _task(title=f"Merge {URL}", **fields)
    assert review_evidence(data, {}).reviewers == reviewers


# --- the decision -------------------------------------------------------------------------------

DECISIONS: list[
    tuple[str | None, tuple[str, ...], tuple[str, ...], str | None, str | None]
] = [
    # author, --github-reviewer, the task's reviewers -> reason, selected
    (None, ("hubot",), (), AUTHOR_MISSING, None),
    ("mona", (), (), REVIEWER_MISSING, None),
    ("mona", ("Mona",), (), SELF_REVIEW.format(author="mona"), None),
    ("mona", ("mona",), ("MONA",), SELF_REVIEW.format(author="mona"), None),
    ("mona", ("mona", "hubot"), (), None, "hubot"),
    ("mona", (), ("octo",), None, "octo"),
    ("mona", ("hubot",), ("octo",), None, "hubot"),  # the option's come first
]


@pytest.mark.parametrize(
    ("author", "options", "stated", "reason", "selected"), DECISIONS
)
def test_a_reviewer_who_is_not_the_author_is_required(
    author: str | None,
    options: tuple[str, ...],
    stated: tuple[str, ...],
    reason: str | None,
    selected: str | None,
) -> None:
    decision = reviewer_decision(author, options, stated)
    assert (decision.reason, decision.selected) == (reason, selected)
    assert decision.allowed is (reason is None)


def test_upstreams_reason_words() -> None:
    assert AUTHOR_MISSING == (
        "PR approval/merge route requires PR author evidence before selecting a "
        "non-author GitHub reviewer"
    )
    assert REVIEWER_MISSING == (
        "PR approval/merge route requires --github-reviewer, --github-reviewer-pool, or "
        "task metadata github_reviewer/github_reviewer_pool with a login different from "
        "the PR author"
    )
    assert SELF_REVIEW.format(author="mona") == (
        "PR approval/merge route reviewer candidates match PR author mona; self-review "
        "is not routable"
    )
    assert FRESHNESS_SKIP.format(state="closed") == (
        "PR is already closed; skipping merge/review route (freshness gate)"
    )
