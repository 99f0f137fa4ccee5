"""The REST routes of the GitHub stand-in (tests/forge_standin.py): each answers one
GitHub call from the stand-in's store as GitHub does (its status, its shape, its messages),
called with the stand-in's lock held. The list of routes is in tests/forge_standin.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

from tests.forge_payloads import (
    API,
    WEB,
    ZERO_SHA,
    issue_object,
    label_object,
    next_id,
    now,
    pull_request_object,
    user,
)

if TYPE_CHECKING:
    from tests.forge_standin import Forge

NOT_COLLABORATOR = (
    "Reviews may only be requested from collaborators. One or more of the users or "
    "teams you specified is not a collaborator of the {owner}/{repo} repository."
)
NOT_FOUND = {"message": "Not Found"}
Answer = tuple[int, Any]
Params = dict[str, str]


def route(forge: Forge, method: str, path: str, query: str, payload: Any) -> Answer:
    for verb, pattern, handler in _ROUTES:
        match = pattern.match(path)
        if match is not None and verb == method:
            params = {k: v[-1] for k, v in parse_qs(query).items()}
            return handler(forge, match, params, payload)
    return 404, NOT_FOUND


def _validation(resource: str, field_name: str, code: str = "invalid") -> Answer:
    error = {"resource": resource, "code": code, "field": field_name}
    return 422, {"message": "Validation Failed", "errors": [error]}


def _create_pull(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    owner, repo = m.group(1), m.group(2)
    if not isinstance(payload, dict) or not payload.get("head"):
        return 422, {
            "message": "Validation Failed",
            "errors": [{"message": "head missing"}],
        }
    head = str(payload["head"]).split(":")[-1]
    if any(
        p["head"]["ref"] == head and p.get("state", "open") == "open"
        for p in forge.pulls.values()
    ):
        message = f"A pull request already exists for {owner}:{payload['head']}."
        return 422, {
            "message": "Validation Failed",
            "errors": [{"message": message}],
        }
    number = forge.next_number()
    base = payload.get("base")
    stamp = now()
    forge.pulls[number] = pull_request_object(
        {
            "number": number,
            "html_url": f"{WEB}/{owner}/{repo}/pull/{number}",
            "state": "open",
            "merged": False,
            "draft": bool(payload.get("draft")),
            "title": payload.get("title"),
            "body": payload.get("body"),
            "user": user(forge.login),
            "head": {"ref": head, "sha": forge.git_sha(head) or ZERO_SHA},
            "base": {"ref": base, "sha": forge.git_sha(base) or ZERO_SHA},
            "created_at": stamp,
            "updated_at": stamp,
        }
    )
    return 201, forge.pulls[number]


def _list_pulls(forge: Forge, m: re.Match[str], params: Params, payload: Any) -> Answer:
    state = params.get("state", "open")
    if state not in ("open", "closed", "all"):
        return _validation("Issue", "state")
    head = params.get("head", "").split(":")[-1]
    base = params.get("base")
    found = [
        forge.served(p)
        for _, p in sorted(forge.pulls.items(), reverse=True)
        if (state == "all" or p.get("state", "open") == state)
        and (not head or p["head"]["ref"] == head)
        and (not base or (p.get("base") or {}).get("ref") == base)
    ]
    return 200, forge.page(found, params, m.string)


def _get_pull(forge: Forge, m: re.Match[str], params: Params, payload: Any) -> Answer:
    found = forge.pulls.get(int(m.group(3)))
    return (200, forge.served(found)) if found else (404, NOT_FOUND)


def _update_pull(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    pull = forge.pulls.get(int(m.group(3)))
    if pull is None:
        return 404, NOT_FOUND
    if not isinstance(payload, dict):
        return 400, {"message": "Problems parsing JSON"}
    state = payload.get("state")
    if state is not None and state not in ("open", "closed"):
        return _validation("PullRequest", "state")
    if state == "open" and pull.get("merged"):
        return 422, {
            "message": "Validation Failed",
            "errors": [
                {
                    "message": "state cannot be changed. The pull request has been merged."
                }
            ],
        }
    for key in ("title", "body"):
        if key in payload:
            pull[key] = payload[key]
    if payload.get("base"):
        pull.setdefault("base", {})["ref"] = payload["base"]
    if state is not None and state != pull.get("state"):
        pull.update(state=state, closed_at=now() if state == "closed" else None)
    pull["updated_at"] = now()
    return 200, forge.served(pull)


def _request_reviewers(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    owner, repo = m.group(1), m.group(2)
    pull = forge.pulls.get(int(m.group(3)))
    if pull is None:
        return 404, NOT_FOUND
    logins = payload.get("reviewers") if isinstance(payload, dict) else None
    if not isinstance(logins, list):
        return 422, {"message": "Invalid request.", "errors": []}
    if forge.collaborators is not None and set(logins) - forge.collaborators:
        return 422, {"message": NOT_COLLABORATOR.format(owner=owner, repo=repo)}
    have = pull.setdefault("requested_reviewers", [])
    have += [{"login": x} for x in logins if {"login": x} not in have]
    return 201, forge.served(pull)


def _listed(
    forge: Forge,
    store: dict[int, list[dict[str, Any]]],
    m: re.Match[str],
    params: Params,
) -> Answer:
    number = int(m.group(3))
    if number not in forge.pulls:
        return 404, NOT_FOUND
    return 200, forge.page(store.get(number, []), params, m.string)


def _list_reviews(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    return _listed(forge, forge.reviews, m, params)


def _list_review_comments(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    return _listed(forge, forge.review_comments, m, params)


def _list_check_runs(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    sha = unquote(m.group(3))
    for pull in forge.pulls.values():
        if pull["head"]["ref"] == sha:
            sha = forge.served(pull)["head"]["sha"]
    runs = [
        r
        for r in sorted(forge.check_runs, key=lambda r: r["id"], reverse=True)
        if r["head_sha"] == sha
        and params.get("check_name", r["name"]) == r["name"]
        and params.get("status", r["status"]) == r["status"]
    ]
    if params.get("filter", "latest") == "latest":
        names = [r["name"] for r in runs]
        runs = [r for i, r in enumerate(runs) if r["name"] not in names[:i]]
    page = forge.page(runs, params, m.string)
    return 200, {"total_count": len(runs), "check_runs": page}


def _target(forge: Forge, m: re.Match[str]) -> tuple[int, dict[str, Any] | None]:
    number = int(m.group(3))
    return number, forge.pulls.get(number) or forge.issues.get(number)


def _get_issue(forge: Forge, m: re.Match[str], params: Params, payload: Any) -> Answer:
    number, found = _target(forge, m)
    if found is None:
        return 404, NOT_FOUND
    if number in forge.issues:
        return 200, forge.issues[number]
    repo = f"{m.group(1)}/{m.group(2)}"
    pull = forge.served(found)
    issue = issue_object(
        repo,
        number,
        pull.get("title") or "",
        pull.get("body"),
        (),
        state=pull.get("state", "open"),
    )
    issue |= {
        "html_url": pull["html_url"],
        "labels": pull.get("labels", []),
        "user": pull.get("user") or issue["user"],
        "pull_request": {
            "url": pull.get("url"),
            "html_url": pull["html_url"],
            "merged_at": pull.get("merged_at"),
        },
    }
    return 200, issue


def _list_comments(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    number, found = _target(forge, m)
    if found is None:
        return 404, NOT_FOUND
    return 200, forge.page(forge.comments.get(number, []), params, m.string)


def _create_comment(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    number, found = _target(forge, m)
    if found is None:
        return 404, NOT_FOUND
    body = payload.get("body") if isinstance(payload, dict) else None
    if not isinstance(body, str) or not body:
        return _validation("IssueComment", "body", "missing_field")
    cid = next_id()
    repo = f"{m.group(1)}/{m.group(2)}"
    stamp = now()
    comment = {
        "id": cid,
        "node_id": f"IC_{cid}",
        "url": f"{API}/repos/{repo}/issues/comments/{cid}",
        "html_url": f"{found['html_url']}#issuecomment-{cid}",
        "issue_url": f"{API}/repos/{repo}/issues/{number}",
        "body": body,
        "user": user(forge.login),
        "created_at": stamp,
        "updated_at": stamp,
        "author_association": "MEMBER",
    }
    forge.comments.setdefault(number, []).append(comment)
    if isinstance(found.get("comments"), int):
        found["comments"] += 1
    return 201, comment


def _list_labels(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    _, found = _target(forge, m)
    return (200, found.get("labels", [])) if found else (404, NOT_FOUND)


def _add_labels(forge: Forge, m: re.Match[str], params: Params, payload: Any) -> Answer:
    _, found = _target(forge, m)
    if found is None:
        return 404, NOT_FOUND
    names = payload.get("labels") if isinstance(payload, dict) else payload
    if not isinstance(names, list) or not names:
        return 422, {"message": "Invalid request.", "errors": ["labels"]}
    names = [n.get("name") if isinstance(n, dict) else n for n in names]
    if not all(isinstance(n, str) and n for n in names):
        return 422, {"message": "Invalid request.", "errors": ["labels"]}
    labels = found.setdefault("labels", [])
    repo = f"{m.group(1)}/{m.group(2)}"
    for name in names:
        if all(label["name"] != name for label in labels):
            labels.append(label_object(repo, name))
    return 200, labels


def _remove_label(
    forge: Forge, m: re.Match[str], params: Params, payload: Any
) -> Answer:
    _, found = _target(forge, m)
    name = unquote(m.group(4))
    labels = found.get("labels", []) if found else []
    if found is None or all(label["name"] != name for label in labels):
        return 404, {"message": "Label does not exist"}
    found["labels"] = [label for label in labels if label["name"] != name]
    return 200, found["labels"]


_REPO = r"^/repos/([^/]+)/([^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], Callable[..., Answer]]] = [
    (verb, re.compile(_REPO + tail + "$"), handler)
    for verb, tail, handler in (
        ("POST", "/pulls", _create_pull),
        ("GET", "/pulls", _list_pulls),
        ("GET", r"/pulls/(\d+)", _get_pull),
        ("PATCH", r"/pulls/(\d+)", _update_pull),
        ("POST", r"/pulls/(\d+)/requested_reviewers", _request_reviewers),
        ("GET", r"/pulls/(\d+)/reviews", _list_reviews),
        ("GET", r"/pulls/(\d+)/comments", _list_review_comments),
        ("GET", r"/commits/([^/]+)/check-runs", _list_check_runs),
        ("GET", r"/issues/(\d+)", _get_issue),
        ("GET", r"/issues/(\d+)/comments", _list_comments),
        ("POST", r"/issues/(\d+)/comments", _create_comment),
        ("GET", r"/issues/(\d+)/labels", _list_labels),
        ("POST", r"/issues/(\d+)/labels", _add_labels),
        ("DELETE", r"/issues/(\d+)/labels/([^/]+)", _remove_label),
    )
]
