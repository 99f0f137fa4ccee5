"""GitHub's objects and webhook payloads as GitHub shapes them, for the GitHub stand-in
(tests/forge_standin.py) and the tests that drive loopsweb with it. Standard library only.

The webhook payload builders take the stand-in's stored pull request dict (`forge.pull(n)`,
which reads its head first) so that number, head ref and head sha agree with what the REST
answers say; each returns the whole payload, with `repository` (`full_name`, `name`,
`owner.login`, ...) and `sender`:

    review_payload(pull, state, body, commit_id=None, *, login="mona", review_id=None)
        `pull_request_review`, action `submitted`; `review.state` lower case as webhooks
        carry it (`changes_requested`, `approved`, `commented`), whatever case is given
    review_comment_payload(pull, body, path, line, commit_id=None, *, comment_id=None,
                           login="mona", review_id=None)
        `pull_request_review_comment`, action `created`
    check_run_payload(pull, name, conclusion, *, summary="", details_url=None,
                      check_run_id=None, head_sha=None, title=None, login=...)
        `check_run`, action `completed` (`conclusion` failure, timed_out, success, ...)
    check_suite_payload(pull, conclusion, *, head_sha=None, suite_id=None, login=...)
        `check_suite`, action `completed`
    issue_payload(action, repo, number, title, body, labels, *, state="open", label=None,
                  login="mona")
        `issues` (opened, edited, labeled, unlabeled, closed, ...); `labels` are names
    pull_request_payload(action, pull, *, merged=False, before=None, login="mona")
        `pull_request`; `closed` carries `merged` (and `merged_at` when merged),
        `synchronize` carries `before` and `after` (the pull request's head sha)

A commit_id or head_sha left out is the pull request's head sha. The REST objects the stand-in
serves are made here too (`review_object`, `review_comment_object`, `check_run_object`,
`issue_object`, `label_object`, `pull_request_object`), so a review's id, a check run's id
and their URLs are the same in a REST answer and in a webhook. Ids not given are drawn from
one counter.
"""

from __future__ import annotations

import copy
import itertools
import zlib
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

API = "https://api.github.example"
WEB = "https://github.example"
ZERO_SHA = "0" * 40
CHECKS_APP = {"id": 15368, "slug": "github-actions", "name": "GitHub Actions"}
CHECKS_LOGIN = "github-actions[bot]"
_ids = itertools.count(4_100_001)


def next_id() -> int:
    return next(_ids)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _number_of(text: str) -> int:
    return zlib.crc32(text.encode()) % 90_000_000 + 1_000_000


def user(login: str) -> dict[str, Any]:
    uid = _number_of(login)
    return {
        "login": login,
        "id": uid,
        "node_id": f"U_{uid}",
        "type": "Bot" if login.endswith("[bot]") else "User",
        "site_admin": False,
        "html_url": f"{WEB}/{login}",
        "url": f"{API}/users/{login}",
    }


def repository(full_name: str) -> dict[str, Any]:
    owner, name = full_name.split("/", 1)
    rid = _number_of(full_name)
    return {
        "id": rid,
        "node_id": f"R_{rid}",
        "name": name,
        "full_name": full_name,
        "private": False,
        "owner": user(owner),
        "html_url": f"{WEB}/{full_name}",
        "url": f"{API}/repos/{full_name}",
        "fork": False,
        "default_branch": "main",
    }


def repo_of(pull: dict[str, Any]) -> str:
    """`owner/name` of a stored pull request: its base repository's, else its html_url's."""
    repo = (pull.get("base") or {}).get("repo")
    if isinstance(repo, dict) and repo.get("full_name"):
        return str(repo["full_name"])
    owner, name = str(pull["html_url"]).split("://", 1)[-1].split("/")[1:3]
    return f"{owner}/{name}"


def head_sha(pull: dict[str, Any]) -> str:
    return str((pull.get("head") or {}).get("sha") or ZERO_SHA)


def _pull_api(pull: dict[str, Any]) -> str:
    return f"{API}/repos/{repo_of(pull)}/pulls/{pull['number']}"


def pull_request_object(pull: dict[str, Any]) -> dict[str, Any]:
    """A copy of a stored pull request with the fields GitHub always sends filled in."""
    full = repo_of(pull)
    out = copy.deepcopy(pull)
    number = out["number"]
    out.setdefault("url", _pull_api(pull))
    out.setdefault("id", _number_of(f"{full}#{number}"))
    out.setdefault("node_id", f"PR_{out['id']}")
    out.setdefault("html_url", f"{WEB}/{full}/pull/{number}")
    for key, value in (
        ("state", "open"),
        ("locked", False),
        ("title", None),
        ("body", None),
        ("draft", False),
        ("merged", False),
        ("merged_at", None),
        ("closed_at", None),
        ("labels", []),
    ):
        out.setdefault(key, value)
    out.setdefault("user", user("mona"))
    out.setdefault("issue_url", f"{API}/repos/{full}/issues/{number}")
    out.setdefault("comments_url", f"{API}/repos/{full}/issues/{number}/comments")
    out.setdefault("review_comments_url", f"{out['url']}/comments")
    for side in ("head", "base"):
        branch = out.setdefault(side, {})
        branch.setdefault("ref", "main" if side == "base" else None)
        branch.setdefault("sha", ZERO_SHA)
        branch.setdefault("label", f"{full.split('/')[0]}:{branch['ref']}")
        branch.setdefault("repo", repository(full))
    return out


def _pull_ref(pull: dict[str, Any]) -> dict[str, Any]:
    """A pull request as check runs and suites list it: number, url, head and base."""
    repo = repository(repo_of(pull))
    short = {"id": repo["id"], "url": repo["url"], "name": repo["name"]}
    base = pull.get("base") or {}
    return {
        "url": _pull_api(pull),
        "id": _number_of(f"{repo_of(pull)}#{pull['number']}"),
        "number": pull["number"],
        "head": {"ref": pull["head"]["ref"], "sha": head_sha(pull), "repo": short},
        "base": {
            "ref": base.get("ref", "main"),
            "sha": base.get("sha", ZERO_SHA),
            "repo": short,
        },
    }


def review_object(
    pull: dict[str, Any],
    *,
    review_id: int,
    state: str,
    body: str | None,
    commit_id: str,
    login: str,
) -> dict[str, Any]:
    html = f"{pull['html_url']}#pullrequestreview-{review_id}"
    return {
        "id": review_id,
        "node_id": f"PRR_{review_id}",
        "user": user(login),
        "body": body,
        "state": state,
        "html_url": html,
        "pull_request_url": _pull_api(pull),
        "author_association": "COLLABORATOR",
        "_links": {"html": {"href": html}, "pull_request": {"href": _pull_api(pull)}},
        "submitted_at": now(),
        "commit_id": commit_id,
    }


def review_comment_object(
    pull: dict[str, Any],
    *,
    comment_id: int,
    body: str,
    path: str,
    line: int,
    commit_id: str,
    login: str,
    review_id: int | None,
) -> dict[str, Any]:
    api = f"{API}/repos/{repo_of(pull)}/pulls/comments/{comment_id}"
    html = f"{pull['html_url']}#discussion_r{comment_id}"
    stamp = now()
    return {
        "url": api,
        "pull_request_review_id": review_id,
        "id": comment_id,
        "node_id": f"PRRC_{comment_id}",
        "diff_hunk": f"@@ -{line},1 +{line},1 @@",
        "path": path,
        "position": 1,
        "original_position": 1,
        "commit_id": commit_id,
        "original_commit_id": commit_id,
        "user": user(login),
        "body": body,
        "created_at": stamp,
        "updated_at": stamp,
        "html_url": html,
        "pull_request_url": _pull_api(pull),
        "author_association": "COLLABORATOR",
        "_links": {
            "self": {"href": api},
            "html": {"href": html},
            "pull_request": {"href": _pull_api(pull)},
        },
        "start_line": None,
        "original_start_line": None,
        "start_side": None,
        "line": line,
        "original_line": line,
        "side": "RIGHT",
        "subject_type": "line",
    }


def suite_id_of(sha: str) -> int:
    """The check suite of a commit (one app: one suite per head sha)."""
    return _number_of(f"suite:{sha}")


def check_run_object(
    pull: dict[str, Any],
    *,
    check_run_id: int,
    name: str,
    conclusion: str | None,
    sha: str,
    summary: str,
    details_url: str | None,
    title: str | None = None,
) -> dict[str, Any]:
    full = repo_of(pull)
    api = f"{API}/repos/{full}/check-runs/{check_run_id}"
    stamp = now()
    return {
        "id": check_run_id,
        "node_id": f"CR_{check_run_id}",
        "head_sha": sha,
        "external_id": "",
        "url": api,
        "html_url": f"{WEB}/{full}/runs/{check_run_id}",
        "details_url": details_url or f"{WEB}/{full}/actions/runs/{check_run_id}",
        "status": "completed" if conclusion else "in_progress",
        "conclusion": conclusion,
        "started_at": stamp,
        "completed_at": stamp if conclusion else None,
        "output": {
            "title": title if title is not None else f"{name}: {conclusion}",
            "summary": summary,
            "text": None,
            "annotations_count": 0,
            "annotations_url": f"{api}/annotations",
        },
        "name": name,
        "check_suite": {"id": suite_id_of(sha)},
        "app": dict(CHECKS_APP, owner=user("github")),
        "pull_requests": [_pull_ref(pull)],
    }


def label_object(repo: str, name: str) -> dict[str, Any]:
    lid = _number_of(f"{repo}:{name}")
    return {
        "id": lid,
        "node_id": f"LA_{lid}",
        "url": f"{API}/repos/{repo}/labels/{quote(name, safe='')}",
        "name": name,
        "color": "ededed",
        "default": False,
        "description": None,
    }


def issue_object(
    repo: str,
    number: int,
    title: str,
    body: str | None,
    labels: Iterable[str],
    *,
    state: str = "open",
    login: str = "mona",
) -> dict[str, Any]:
    api = f"{API}/repos/{repo}/issues/{number}"
    stamp = now()
    iid = _number_of(f"{repo}#{number}")
    return {
        "url": api,
        "repository_url": f"{API}/repos/{repo}",
        "labels_url": f"{api}/labels{{/name}}",
        "comments_url": f"{api}/comments",
        "html_url": f"{WEB}/{repo}/issues/{number}",
        "id": iid,
        "node_id": f"I_{iid}",
        "number": number,
        "title": title,
        "user": user(login),
        "labels": [label_object(repo, name) for name in labels],
        "state": state,
        "state_reason": "completed" if state == "closed" else None,
        "locked": False,
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": 0,
        "created_at": stamp,
        "updated_at": stamp,
        "closed_at": stamp if state == "closed" else None,
        "author_association": "COLLABORATOR",
        "body": body,
    }


def _envelope(action: str, full_name: str, login: str, **body: Any) -> dict[str, Any]:
    return {
        "action": action,
        **body,
        "repository": repository(full_name),
        "sender": user(login),
    }


def review_payload(
    pull: dict[str, Any],
    state: str,
    body: str | None,
    commit_id: str | None = None,
    *,
    login: str = "mona",
    review_id: int | None = None,
) -> dict[str, Any]:
    review = review_object(
        pull,
        review_id=review_id if review_id is not None else next_id(),
        state=state.lower(),
        body=body,
        commit_id=commit_id or head_sha(pull),
        login=login,
    )
    pull_request = pull_request_object(pull)
    return _envelope(
        "submitted", repo_of(pull), login, review=review, pull_request=pull_request
    )


def review_comment_payload(
    pull: dict[str, Any],
    body: str,
    path: str,
    line: int,
    commit_id: str | None = None,
    *,
    comment_id: int | None = None,
    login: str = "mona",
    review_id: int | None = None,
) -> dict[str, Any]:
    comment = review_comment_object(
        pull,
        comment_id=comment_id if comment_id is not None else next_id(),
        body=body,
        path=path,
        line=line,
        commit_id=commit_id or head_sha(pull),
        login=login,
        review_id=review_id,
    )
    pull_request = pull_request_object(pull)
    return _envelope(
        "created", repo_of(pull), login, comment=comment, pull_request=pull_request
    )


def check_run_payload(
    pull: dict[str, Any],
    name: str,
    conclusion: str,
    *,
    summary: str = "",
    details_url: str | None = None,
    check_run_id: int | None = None,
    head_sha: str | None = None,
    title: str | None = None,
    login: str = CHECKS_LOGIN,
) -> dict[str, Any]:
    check_run = check_run_object(
        pull,
        check_run_id=check_run_id if check_run_id is not None else next_id(),
        name=name,
        conclusion=conclusion,
        sha=head_sha or _head(pull),
        summary=summary,
        details_url=details_url,
        title=title,
    )
    return _envelope("completed", repo_of(pull), login, check_run=check_run)


def _head(pull: dict[str, Any]) -> str:
    return head_sha(pull)


def check_suite_payload(
    pull: dict[str, Any],
    conclusion: str,
    *,
    head_sha: str | None = None,
    suite_id: int | None = None,
    login: str = CHECKS_LOGIN,
) -> dict[str, Any]:
    full = repo_of(pull)
    sha = head_sha or _head(pull)
    sid = suite_id if suite_id is not None else suite_id_of(sha)
    stamp = now()
    suite = {
        "id": sid,
        "node_id": f"CS_{sid}",
        "head_branch": pull["head"]["ref"],
        "head_sha": sha,
        "status": "completed",
        "conclusion": conclusion,
        "url": f"{API}/repos/{full}/check-suites/{sid}",
        "before": None,
        "after": sha,
        "pull_requests": [_pull_ref(pull)],
        "app": dict(CHECKS_APP, owner=user("github")),
        "created_at": stamp,
        "updated_at": stamp,
        "latest_check_runs_count": 1,
        "check_runs_url": f"{API}/repos/{full}/check-suites/{sid}/check-runs",
    }
    return _envelope("completed", full, login, check_suite=suite)


def issue_payload(
    action: str,
    repo: str,
    number: int,
    title: str,
    body: str | None,
    labels: Iterable[str],
    *,
    state: str = "open",
    label: str | None = None,
    login: str = "mona",
) -> dict[str, Any]:
    issue = issue_object(repo, number, title, body, labels, state=state, login=login)
    extra = {"label": label_object(repo, label)} if label is not None else {}
    return _envelope(action, repo, login, issue=issue, **extra)


def pull_request_payload(
    action: str,
    pull: dict[str, Any],
    *,
    merged: bool = False,
    before: str | None = None,
    login: str = "mona",
) -> dict[str, Any]:
    pull_request = pull_request_object(pull)
    extra: dict[str, Any] = {}
    if action == "closed":
        stamp = pull_request["closed_at"] or now()
        pull_request.update(state="closed", merged=merged, closed_at=stamp)
        pull_request["merged_at"] = (
            (pull_request["merged_at"] or stamp) if merged else None
        )
    elif action == "reopened":
        pull_request.update(state="open", merged=False, closed_at=None, merged_at=None)
    elif action == "synchronize":
        extra = {"before": before or ZERO_SHA, "after": head_sha(pull)}
    return _envelope(
        action,
        repo_of(pull),
        login,
        number=pull["number"],
        pull_request=pull_request,
        **extra,
    )
