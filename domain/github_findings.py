"""What a pull request's reviews, review comments and checks say, as a revision's findings
(docs/revisions.md §3): pure functions over GitHub's JSON objects, the same whether they came
in a webhook's payload (routing.github_hooks) or from the REST API (routing.github_sync).

Only a trusted author's review or comment counts (`author_refusal`: an owner, member or
collaborator by default, never a bot). Every field is untrusted: text is bounded here and fenced where it meets a prompt
(domain.revisions); ids, logins, paths, lines, commits and URLs are kept as the source of
each finding (`details.sources`), and the source's `key` (`review:<id>`, `comment:<id>`,
`check_run:<id>`, `check_suite:<id>`) is what makes the same finding count once however
it arrives.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

FAILING = ("failure", "timed_out")
# Who may send work back with a review or a comment (GitHub's `author_association`):
# LOOPSWEB_GITHUB_TRUSTED_ASSOCIATIONS, by default the repository's owner, its
# organization's members and its collaborators; never a bot account.
DEFAULT_TRUSTED = ("OWNER", "MEMBER", "COLLABORATOR")
UNTRUSTED = "ignored: {login} ({association}) may not send the work back"
BODY_LIMIT = 4_000


@dataclass(frozen=True)
class Finding:
    trigger: str  # review or check
    text: str
    source: dict[str, Any]


def obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def text(value: Any, limit: int = BODY_LIMIT) -> str:
    return str(value)[:limit] if isinstance(value, str | int) else ""


def _id(value: Any) -> int | str | None:
    return (
        value if isinstance(value, int | str) and not isinstance(value, bool) else None
    )


def author_refusal(item: dict[str, Any], trusted: Collection[str]) -> str | None:
    """Why a review's or comment's author may not send the work back (untrusted text on a
    public repository is anyone's: it must not spend a round), None when they may."""
    user = obj(item.get("user"))
    association = str(item.get("author_association") or "NONE").upper()
    login = text(user.get("login"), 100) or "someone"
    if str(user.get("type") or "") == "Bot" or association not in {
        t.upper() for t in trusted
    }:
        return UNTRUSTED.format(login=login, association=association)
    return None


def review_finding(review: dict[str, Any]) -> Finding | None:
    """A review that requests changes (webhooks say `changes_requested`, the REST API
    `CHANGES_REQUESTED`), else None."""
    if str(review.get("state") or "").lower() != "changes_requested":
        return None
    login = text(obj(review.get("user")).get("login"), 100)
    commit = text(review.get("commit_id"), 64)
    return Finding(
        "review",
        f"Review by {login or 'a reviewer'} requesting changes (on commit "
        f"{commit[:12] or '?'}):\n{text(review.get('body')) or '(no text)'}",
        {
            "key": f"review:{_id(review.get('id'))}",
            "trigger": "review",
            "reviewId": _id(review.get("id")),
            "login": login,
            "commit": commit,
            "url": text(review.get("html_url"), 500),
        },
    )


def comment_finding(comment: dict[str, Any]) -> Finding:
    """A review comment: its `path:line` and the commit it was made on."""
    path = text(comment.get("path"), 500)
    line = comment.get("line") or comment.get("original_line")
    line = line if isinstance(line, int) and not isinstance(line, bool) else None
    where = f"{path}:{line}" if path and line is not None else path or "?"
    commit = text(comment.get("commit_id"), 64)
    login = text(obj(comment.get("user")).get("login"), 100)
    return Finding(
        "review",
        f"Review comment by {login or 'a reviewer'} at {where} (on commit "
        f"{commit[:12] or '?'}):\n{text(comment.get('body')) or '(no text)'}",
        {
            "key": f"comment:{_id(comment.get('id'))}",
            "trigger": "review",
            "commentId": _id(comment.get("id")),
            "login": login,
            "path": path,
            "line": line,
            "commit": commit,
            "url": text(comment.get("html_url"), 500),
        },
    )


def check_run_finding(check: dict[str, Any]) -> Finding | None:
    """A check run that ended `failure` or `timed_out`, else None: its name, title,
    summary and the URL of its logs."""
    conclusion = str(check.get("conclusion") or "")
    if conclusion not in FAILING:
        return None
    name = text(check.get("name"), 200) or "a check"
    output = obj(check.get("output"))
    logs = text(check.get("details_url") or check.get("html_url"), 500)
    commit = text(check.get("head_sha"), 64)
    return Finding(
        "check",
        f"Check {name} ended {conclusion} on commit {commit[:12] or '?'}.\n"
        f"{text(output.get('title'), 500)}\n{text(output.get('summary'))}\n"
        f"Logs: {logs or '(no URL)'}",
        {
            "key": f"check_run:{_id(check.get('id'))}",
            "trigger": "check",
            "checkRunId": _id(check.get("id")),
            "name": name,
            "conclusion": conclusion,
            "commit": commit,
            "url": logs,
        },
    )


def check_suite_finding(suite: dict[str, Any]) -> Finding | None:
    """A check suite that ended `failure` or `timed_out`, else None."""
    conclusion = str(suite.get("conclusion") or "")
    if conclusion not in FAILING:
        return None
    app = text(obj(suite.get("app")).get("name"), 200) or "a check suite"
    commit = text(suite.get("head_sha"), 64)
    return Finding(
        "check",
        f"The check suite of {app} ended {conclusion} on commit {commit[:12] or '?'}.",
        {
            "key": f"check_suite:{_id(suite.get('id'))}",
            "trigger": "check",
            "checkSuiteId": _id(suite.get("id")),
            "name": app,
            "conclusion": conclusion,
            "commit": commit,
        },
    )


def pull_numbers(check: dict[str, Any]) -> list[int]:
    """The numbers of the pull requests a check run or suite names."""
    pulls = check.get("pull_requests")
    return [
        number
        for pull in (pulls if isinstance(pulls, list) else [])
        if isinstance(number := obj(pull).get("number"), int)
    ]
