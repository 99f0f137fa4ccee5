"""The webhook payloads of the GitHub stand-in (tests/forge_payloads.py) carry the fields
GitHub sends for each event, built from the stand-in's stored pull request so that number,
head ref and head sha agree with its REST answers. No server, no database."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.forge_payloads import (
    check_run_payload,
    check_suite_payload,
    issue_payload,
    pull_request_payload,
    review_comment_payload,
    review_payload,
)
from tests.forge_standin import Forge

SHA = "c" * 40
PULL_URL = "https://github.example/acme/widgets/pull/1"
Build = Callable[[dict[str, Any]], dict[str, Any]]
PAYLOADS: dict[str, tuple[Build, dict[str, Any]]] = {
    "pull_request_review": (
        lambda p: review_payload(
            p, "CHANGES_REQUESTED", "No", login="hubot", review_id=9
        ),
        {
            "action": "submitted",
            "sender.login": "hubot",
            "review.id": 9,
            "review.state": "changes_requested",
            "review.body": "No",
            "review.commit_id": SHA,
            "review.user.login": "hubot",
            "review.html_url": f"{PULL_URL}#pullrequestreview-9",
            "pull_request.number": 1,
            "pull_request.state": "open",
            "pull_request.html_url": PULL_URL,
            "pull_request.head.ref": "feature",
            "pull_request.head.sha": SHA,
        },
    ),
    "pull_request_review_comment": (
        lambda p: review_comment_payload(p, "Here", "app.py", 12, comment_id=3),
        {
            "action": "created",
            "comment.id": 3,
            "comment.body": "Here",
            "comment.path": "app.py",
            "comment.line": 12,
            "comment.original_line": 12,
            "comment.commit_id": SHA,
            "comment.user.login": "mona",
            "comment.html_url": f"{PULL_URL}#discussion_r3",
            "pull_request.head.sha": SHA,
        },
    ),
    "check_run": (
        lambda p: check_run_payload(
            p, "tests", "failure", summary="2 failed", details_url="https://ci/1"
        ),
        {
            "action": "completed",
            "sender.login": "github-actions[bot]",
            "check_run.name": "tests",
            "check_run.conclusion": "failure",
            "check_run.status": "completed",
            "check_run.head_sha": SHA,
            "check_run.details_url": "https://ci/1",
            "check_run.output.summary": "2 failed",
            "check_run.output.title": "tests: failure",
            "check_run.pull_requests.0.number": 1,
            "check_run.pull_requests.0.head.ref": "feature",
            "check_run.pull_requests.0.head.sha": SHA,
        },
    ),
    "check_suite": (
        lambda p: check_suite_payload(p, "timed_out"),
        {
            "action": "completed",
            "check_suite.conclusion": "timed_out",
            "check_suite.head_sha": SHA,
            "check_suite.head_branch": "feature",
            "check_suite.pull_requests.0.number": 1,
        },
    ),
    "issues": (
        lambda p: issue_payload(
            "labeled", "acme/widgets", 5, "Bug", "Body", ["bug", "loop"], label="loop"
        ),
        {
            "action": "labeled",
            "issue.number": 5,
            "issue.title": "Bug",
            "issue.body": "Body",
            "issue.state": "open",
            "issue.labels.1.name": "loop",
            "issue.user.login": "mona",
            "issue.html_url": "https://github.example/acme/widgets/issues/5",
            "label.name": "loop",
        },
    ),
    "pull_request merged": (
        lambda p: pull_request_payload("closed", p, merged=True),
        {"action": "closed", "number": 1, "pull_request.merged": True},
    ),
    "pull_request closed": (
        lambda p: pull_request_payload("closed", p),
        {"pull_request.state": "closed", "pull_request.merged_at": None},
    ),
    "pull_request synchronize": (
        lambda p: pull_request_payload("synchronize", p, before="b" * 40),
        {"before": "b" * 40, "after": SHA, "pull_request.head.sha": SHA},
    ),
}


def _at(payload: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        payload = payload[int(key)] if isinstance(payload, list) else payload[key]
    return payload


@pytest.mark.parametrize("event", PAYLOADS)
def test_a_payload_carries_the_fields_github_sends(event: str) -> None:
    build, expected = PAYLOADS[event]
    payload = build(_standin().pull(1))
    assert {path: _at(payload, path) for path in expected} == expected
    repo = payload["repository"]
    assert (repo["full_name"], repo["name"], repo["owner"]["login"]) == (
        "acme/widgets",
        "widgets",
        "acme",
    )
    assert payload["sender"]["login"]


def _standin() -> Forge:
    """A stand-in holding pull request 1 (head `feature` at SHA), asked in-process."""
    forge = Forge()
    opened = {"title": "T", "head": "feature", "base": "main", "body": "B"}
    status, _ = forge.answer(
        "POST", "/repos/acme/widgets/pulls", {}, json.dumps(opened).encode()
    )
    assert status == 201
    forge.set_head(1, SHA)
    return forge


def test_one_suite_holds_the_check_runs_of_a_head() -> None:
    forge = _standin()
    run = forge.add_check_run(1, "tests", "failure", "1 failed")
    suite = check_suite_payload(forge.pull(1), "failure")["check_suite"]
    assert suite["id"] == run["check_suite"]["id"]
    assert (
        suite["id"]
        != forge.add_check_run(1, "tests", "success", head_sha="d" * 40)["check_suite"][
            "id"
        ]
    )
