"""The GitHub stand-in's control channel (tests/forge_standin.py): how a test in another
process adds what GitHub would hold and makes it send the webhooks, on the stand-in's own
server, under `/_standin/` (never a GitHub path; never in `requests` nor RECORD_FILE).

Each POST takes a JSON object and answers JSON; a missing or bad field answers 400, a pull
request number the stand-in does not hold 404. An event is sent to the repository's webhook
set by `POST /_standin/hook` (none set: nothing is sent) and the answer's `delivery` is its
record {event, delivery_id, action, status, body, bad_signature}, or null; every event POST
also takes `delivery_id` (a redelivery) and `bad_signature` (true: signed with another
secret).

    POST /_standin/hook {url, secret}               the repository's webhook
    POST /_standin/head {number, sha}               set_head (sha null: the ref again)
    POST /_standin/review {number, state, body, commit_id?, login?}
         -> 201 {review, delivery}                  add_review + `pull_request_review`
    POST /_standin/review_comment {number, body, path, line, commit_id?, login?}
         -> 201 {comment, delivery}                 + `pull_request_review_comment`
    POST /_standin/check_run {number, name, conclusion, summary?, details_url?, head_sha?}
         -> 201 {check_run, delivery}               add_check_run + `check_run`
    POST /_standin/check_suite {number, conclusion, head_sha?} -> 200 {delivery}
    POST /_standin/issue {action, repo, title, body?, labels?, number?, state?, label?}
         -> 201 {issue, delivery}                   add_issue + `issues`
    POST /_standin/pull_request {number, action, merged?, sha?, before?}
         -> 200 {pull_request, delivery}            closed / reopened move the pull request
                                                    (set_state), `sha` moves its head first
    POST /_standin/webhook {event, payload}         any payload, as given -> 200 {delivery}
    GET  /_standin/deliveries | pulls | requests    what was sent, held, received
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tests.forge_payloads import (
    check_run_payload,
    check_suite_payload,
    issue_payload,
    pull_request_payload,
    review_comment_payload,
    review_payload,
)

if TYPE_CHECKING:
    from tests.forge_standin import Forge

PREFIX = "/_standin/"
Answer = tuple[int, Any]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def control(forge: Forge, method: str, path: str, body: bytes) -> Answer:
    name = urlsplit(path).path[len(PREFIX) :].strip("/")
    if method == "GET":
        with forge.lock:
            numbers = sorted(forge.pulls)
            held = {"deliveries": forge.deliveries, "requests": forge.requests}
            listed = list(held.get(name, []))
        if name == "pulls":
            return 200, [forge.pull(number) for number in numbers]
        return (200, listed) if name in held else (404, {"message": "Not Found"})
    handler = _HANDLERS.get(name)
    if method != "POST" or handler is None:
        return 404, {"message": "Not Found"}
    try:
        data = json.loads(body or b"{}")
        if not isinstance(data, dict):
            raise _Refused(400, "the body is a JSON object")
        return handler(forge, data)
    except _Refused as exc:
        return exc.status, {"message": str(exc)}
    except (KeyError, TypeError, ValueError) as exc:
        return 400, {"message": f"bad request: {exc!r}"}


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise _Refused(400, f"`{key}` is a non-empty string")
    return value


def _number(forge: Forge, data: dict[str, Any]) -> int:
    number = int(data["number"])
    with forge.lock:
        if number not in forge.pulls:
            raise _Refused(404, f"no pull request {number}")
    return number


def _sent(
    forge: Forge, event: str, payload: dict[str, Any], data: dict[str, Any]
) -> dict[str, Any] | None:
    return forge.deliver(
        event,
        payload,
        delivery_id=data.get("delivery_id"),
        bad_signature=bool(data.get("bad_signature")),
    )


def _hook(forge: Forge, data: dict[str, Any]) -> Answer:
    forge.set_hook(_text(data, "url"), _text(data, "secret"))
    return 200, {"url": data["url"]}


def _head(forge: Forge, data: dict[str, Any]) -> Answer:
    number = _number(forge, data)
    forge.set_head(number, data.get("sha"))
    return 200, forge.pull(number)


def _review(forge: Forge, data: dict[str, Any]) -> Answer:
    number = _number(forge, data)
    login = data.get("login", "mona")
    review = forge.add_review(
        number, _text(data, "state"), data.get("body"), data.get("commit_id"), login
    )
    payload = review_payload(
        forge.pull(number),
        review["state"],
        review["body"],
        review["commit_id"],
        login=login,
        review_id=review["id"],
    )
    return 201, {
        "review": review,
        "delivery": _sent(forge, "pull_request_review", payload, data),
    }


def _review_comment(forge: Forge, data: dict[str, Any]) -> Answer:
    number = _number(forge, data)
    login = data.get("login", "mona")
    comment = forge.add_review_comment(
        number,
        _text(data, "body"),
        _text(data, "path"),
        int(data["line"]),
        data.get("commit_id"),
        login=login,
    )
    payload = review_comment_payload(
        forge.pull(number),
        comment["body"],
        comment["path"],
        comment["line"],
        comment["commit_id"],
        comment_id=comment["id"],
        login=login,
    )
    return 201, {
        "comment": comment,
        "delivery": _sent(forge, "pull_request_review_comment", payload, data),
    }


def _check_run(forge: Forge, data: dict[str, Any]) -> Answer:
    number = _number(forge, data)
    run = forge.add_check_run(
        number,
        _text(data, "name"),
        _text(data, "conclusion"),
        data.get("summary", ""),
        data.get("details_url"),
        head_sha=data.get("head_sha"),
        title=data.get("title"),
    )
    payload = check_run_payload(
        forge.pull(number),
        run["name"],
        run["conclusion"],
        summary=run["output"]["summary"],
        details_url=run["details_url"],
        check_run_id=run["id"],
        head_sha=run["head_sha"],
        title=run["output"]["title"],
    )
    return 201, {"check_run": run, "delivery": _sent(forge, "check_run", payload, data)}


def _check_suite(forge: Forge, data: dict[str, Any]) -> Answer:
    number = _number(forge, data)
    payload = check_suite_payload(
        forge.pull(number), _text(data, "conclusion"), head_sha=data.get("head_sha")
    )
    return 200, {"delivery": _sent(forge, "check_suite", payload, data)}


def _issue(forge: Forge, data: dict[str, Any]) -> Answer:
    action, repo = _text(data, "action"), _text(data, "repo")
    labels = [str(name) for name in data.get("labels", [])]
    state = data.get("state", "closed" if action == "closed" else "open")
    login = data.get("login", "mona")
    issue = forge.add_issue(
        repo,
        _text(data, "title"),
        data.get("body", ""),
        labels,
        number=data.get("number"),
        state=state,
        login=login,
    )
    payload = issue_payload(
        action,
        repo,
        issue["number"],
        issue["title"],
        issue["body"],
        labels,
        state=state,
        label=data.get("label"),
        login=login,
    )
    return 201, {"issue": issue, "delivery": _sent(forge, "issues", payload, data)}


def _pull_request(forge: Forge, data: dict[str, Any]) -> Answer:
    number = _number(forge, data)
    action, merged = _text(data, "action"), bool(data.get("merged"))
    before = forge.pull(number)["head"]["sha"]
    if action == "closed":
        forge.set_state(number, "closed", merged=merged)
    elif action == "reopened":
        forge.set_state(number, "open")
    if data.get("sha"):
        forge.set_head(number, data["sha"])
    pull = forge.pull(number)
    payload = pull_request_payload(
        action, pull, merged=merged, before=data.get("before") or before
    )
    return 200, {
        "pull_request": pull,
        "delivery": _sent(forge, "pull_request", payload, data),
    }


def _webhook(forge: Forge, data: dict[str, Any]) -> Answer:
    payload = data.get("payload")
    if not isinstance(payload, dict):
        raise _Refused(400, "`payload` is a JSON object")
    return 200, {"delivery": _sent(forge, _text(data, "event"), payload, data)}


_HANDLERS: dict[str, Callable[[Forge, dict[str, Any]], Answer]] = {
    "hook": _hook,
    "head": _head,
    "review": _review,
    "review_comment": _review_comment,
    "check_run": _check_run,
    "check_suite": _check_suite,
    "issue": _issue,
    "pull_request": _pull_request,
    "webhook": _webhook,
}
