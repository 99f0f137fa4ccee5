"""The GitHub REST calls delivery makes (docs/delivery.md §3), standard library only.

`POST {LOOPSWEB_GITHUB_API_URL}/repos/{owner}/{repo}/pulls` opens a pull request; `GET
.../pulls/{number}` reads one back; `POST .../pulls/{number}/requested_reviewers` asks
reviewers for it. The token comes from LOOPSWEB_GITHUB_TOKEN_FILE, a
0600 env file with a `GITHUB_TOKEN=` line, read and checked as an account's env file is
(agents.envfile); it is sent only in the Authorization header and never stored, logged or
shown: a forge message that echoes it has it replaced.

A refusal (401, 403, 404, 422, 5xx) or a forge that cannot be reached raises ForgeError
with the forge's own message (`message`, and for 422 each `errors[].message`).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.conf import settings

from agents.envfile import EnvFileError, read_env_file
from domain.errors import ApplicationError

FORGE_TIMEOUT_SECONDS = 30
MAX_ANSWER_BYTES = 1024 * 1024
NO_TOKEN_FILE = "LOOPSWEB_GITHUB_TOKEN_FILE is not set: no token to open a pull request"
NO_TOKEN_LINE = "{path} has no GITHUB_TOKEN= line"
FORGE_REFUSED = "GitHub answered {status}: {message}"
FORGE_UNREACHABLE = "GitHub could not be reached: {reason}"
NOT_GITHUB = (
    "the remote {url} is not a GitHub URL: give the route --github-repo OWNER/NAME"
)

_GITHUB_URL = re.compile(
    r"^(?:https://(?:[^@/]+@)?github\.com/|ssh://git@github\.com/|git@github\.com:)"
    r"([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$"
)


class ForgeError(ApplicationError):
    """The forge refused a call or could not be reached (its message, the token never);
    `status` is the HTTP status of a refusal (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PullRequest:
    number: int
    url: str
    state: str
    draft: bool
    head_sha: str | None = None
    author: str | None = None  # the login of its `user` (the review gate)


def github_repo_of(url: str) -> tuple[str, str] | None:
    """(owner, repo) of a github.com remote URL, or None."""
    match = _GITHUB_URL.match(url.strip())
    return (match.group(1), match.group(2)) if match else None


def github_token() -> str:
    path = settings.LOOPSWEB_GITHUB_TOKEN_FILE
    if not path:
        raise ForgeError(NO_TOKEN_FILE)
    try:
        token = read_env_file(path).get("GITHUB_TOKEN", "").strip()
    except EnvFileError as exc:
        raise ForgeError(str(exc)) from None
    if not token:
        raise ForgeError(NO_TOKEN_LINE.format(path=path))
    return token


def _call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    return _exchange(method, path, body).body


@dataclass(frozen=True)
class Answer:
    status: int  # 304: not modified since `etag`
    etag: str | None
    body: Any


def get_if_changed(path: str, etag: str | None) -> Answer:
    """`GET path` with `If-None-Match: etag`: 304 (no body) when nothing changed, which
    GitHub does not count against the rate limit; else the answer and its new ETag."""
    return _exchange("GET", path, None, {"If-None-Match": etag} if etag else {})


def _exchange(
    method: str,
    path: str,
    body: dict[str, Any] | None,
    extra: dict[str, str] | None = None,
) -> Answer:
    token = github_token()
    request = urllib.request.Request(
        settings.LOOPSWEB_GITHUB_API_URL + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {token}",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": "loopsweb",
            **({"Content-Type": "application/json"} if body is not None else {}),
            **(extra or {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=FORGE_TIMEOUT_SECONDS) as answer:
            return Answer(
                answer.status,
                answer.headers.get("ETag"),
                json.loads(answer.read(MAX_ANSWER_BYTES) or b"null"),
            )
    except urllib.error.HTTPError as exc:
        if exc.code == 304:
            return Answer(304, exc.headers.get("ETag"), None)
        message = _forge_message(exc.read(MAX_ANSWER_BYTES), exc.reason)
        raise ForgeError(
            FORGE_REFUSED.format(status=exc.code, message=message).replace(
                token, "[redacted:GITHUB_TOKEN]"
            ),
            status=exc.code,
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ForgeError(FORGE_UNREACHABLE.format(reason=reason)) from None


def _forge_message(raw: bytes, fallback: object) -> str:
    try:
        answer = json.loads(raw)
    except ValueError:
        return str(fallback)
    if not isinstance(answer, dict):
        return str(fallback)
    parts = [str(answer.get("message") or fallback)]
    for error in answer.get("errors") or []:
        if isinstance(error, dict) and error.get("message"):
            parts.append(str(error["message"]))
    return "; ".join(parts)


def _pull_request(answer: Any) -> PullRequest:
    if not isinstance(answer, dict) or not isinstance(answer.get("number"), int):
        raise ForgeError(FORGE_REFUSED.format(status="?", message="no pull request"))
    merged = bool(answer.get("merged") or answer.get("merged_at"))
    return PullRequest(
        number=answer["number"],
        url=str(answer.get("html_url") or ""),
        state="merged" if merged else str(answer.get("state") or "open"),
        draft=bool(answer.get("draft")),
        head_sha=_head_sha(answer.get("head")),
        author=_user_login(answer.get("user")),
    )


def _user_login(user: Any) -> str | None:
    login = user.get("login") if isinstance(user, dict) else None
    return login if isinstance(login, str) and login else None


def _head_sha(head: Any) -> str | None:
    sha = head.get("sha") if isinstance(head, dict) else None
    return sha if isinstance(sha, str) and sha else None


def open_pull_request(
    repo: str, *, head: str, base: str, title: str, body: str, draft: bool
) -> PullRequest:
    """`POST /repos/{repo}/pulls`: the new pull request."""
    fields = {"title": title, "head": head, "base": base, "body": body, "draft": draft}
    return _pull_request(_call("POST", f"/repos/{repo}/pulls", fields))


def find_pull_request(repo: str, *, head: str) -> PullRequest | None:
    """`GET /repos/{repo}/pulls?head=OWNER:BRANCH&state=all`: the newest pull request of
    the branch `head` in `repo`, or None."""
    owner = repo.split("/", 1)[0]
    query = urlencode({"head": f"{owner}:{head}", "state": "all"})
    answer = _call("GET", f"/repos/{repo}/pulls?{query}")
    found = [_pull_request(pr) for pr in answer or [] if isinstance(pr, dict)]
    return max(found, key=lambda pr: pr.number) if found else None


def get_pull_request(repo: str, number: int) -> PullRequest:
    """`GET /repos/{repo}/pulls/{number}`: state open, closed or merged."""
    return _pull_request(_call("GET", f"/repos/{repo}/pulls/{number}"))


def request_reviewers(repo: str, number: int, logins: list[str]) -> list[str]:
    """`POST /repos/{repo}/pulls/{number}/requested_reviewers` with `{"reviewers": ...}`:
    the logins the pull request now has review requests for (as GitHub answers)."""
    answer = _call(
        "POST",
        f"/repos/{repo}/pulls/{number}/requested_reviewers",
        {"reviewers": logins},
    )
    requested = answer.get("requested_reviewers") if isinstance(answer, dict) else None
    found = [
        str(user["login"])
        for user in requested or []
        if isinstance(user, dict) and isinstance(user.get("login"), str)
    ]
    return found


def comment_on_issue(repo: str, number: int, body: str) -> str:
    """`POST /repos/{repo}/issues/{number}/comments` (a pull request is an issue to this
    call): the new comment's URL."""
    answer = _call("POST", f"/repos/{repo}/issues/{number}/comments", {"body": body})
    return str(answer.get("html_url") or "") if isinstance(answer, dict) else ""


def add_labels(repo: str, number: int, labels: list[str]) -> list[str]:
    """`POST /repos/{repo}/issues/{number}/labels`: the labels the issue has now."""
    answer = _call("POST", f"/repos/{repo}/issues/{number}/labels", {"labels": labels})
    return [
        str(label["name"])
        for label in answer or []
        if isinstance(label, dict) and isinstance(label.get("name"), str)
    ]
