"""A GitHub stand-in for the tests (issue 40): a standard library HTTP server on 127.0.0.1
that answers the REST calls loopsweb makes as GitHub does, records each request with its
token, and sends webhooks signed as GitHub signs them. Point LOOPSWEB_GITHUB_API_URL at
`url`. It serves one repository's pull requests (the `{owner}/{repo}` of a path names the
URLs it makes, not another store). The routes are in tests/forge_rest.py, GitHub's objects
and the webhook payload builders in tests/forge_payloads.py, the control channel for tests
in other processes in tests/forge_control.py.

    POST  /repos/{o}/{r}/pulls  -> 201 the pull request {number, html_url, state, draft,
          head {ref, sha}, base, user, labels, ...}; 422 with `errors` for no head or an open
          pull request of that head
    GET   /repos/{o}/{r}/pulls/{n} -> 200 the pull request, or 404
    GET   /repos/{o}/{r}/pulls?state=open|closed|all&head=OWNER:BRANCH&base=B&per_page&page
          -> 200 [pull requests], newest first (state open unless given, as GitHub's);
          a `Link` header names the next and last pages
    PATCH /repos/{o}/{r}/pulls/{n} {state, title, body, base} -> 200 the pull request
    POST  /repos/{o}/{r}/pulls/{n}/requested_reviewers {reviewers} -> 201 the pull request
          with `requested_reviewers` [{login}]; 422 as GitHub words it for a login not in
          `collaborators` (when that is set); 404 for no such pull request
    GET   /repos/{o}/{r}/pulls/{n}/reviews -> 200 [reviews] (state upper case, as REST has it)
    GET   /repos/{o}/{r}/pulls/{n}/comments -> 200 [review comments {path, line, commit_id}]
    GET   /repos/{o}/{r}/commits/{sha or branch}/check-runs?check_name&status&filter
          -> 200 {total_count, check_runs} (filter=latest, the default: the newest of a name)
    GET   /repos/{o}/{r}/issues/{n} -> 200 the issue (a pull request's has `pull_request`)
    GET   /repos/{o}/{r}/issues/{n}/comments, POST {body} -> 201 {id, body, html_url, user}
    GET   /repos/{o}/{r}/issues/{n}/labels, POST {labels: [...]} -> 200 the labels [{name}]
    DELETE /repos/{o}/{r}/issues/{n}/labels/{name} -> 200 the labels left; 404 if absent

Every GET answered 200 carries an `ETag` (a hash of the body); a request whose
`If-None-Match` names it answers 304 with no body, and counts in `not_modified`, not in the
rate limit (`X-RateLimit-Used` / `-Remaining`), as GitHub's conditional requests. Each
request is in `requests` (method, path, query, authorization, body, status, if_none_match).

Tests add what the REST answers: `add_review(number, state, body, commit_id, login)`,
`add_review_comment(number, body, path, line, commit_id)`, `add_check_run(number, name,
conclusion, summary, details_url)` (for the pull request's head unless `head_sha` is given),
`add_issue(repo, title, body, labels)`. `fail_next(status, body)` makes the next calls answer
an error as GitHub would (401 "Bad credentials", 422 with `errors`, 502);
`set_state(number, state, merged)` moves a pull request.

A pull request's head follows the pushes: with `remote_git_dir` (the bare repository
loopsweb pushes to) its `head.sha` is `refs/heads/<head ref>` there, read (git rev-parse)
each time the pull request is served; `set_head(number, sha)` moves it as a human push
would, over the ref, until `set_head(number, None)`. `pull(number)` is the pull request as
served (a copy): give it to the payload builders of tests/forge_payloads.py.

`send_webhook(url, event, payload, *, secret, delivery_id=None, bad_signature=False)` POSTs
as GitHub does (`X-GitHub-Event`, `X-GitHub-Delivery` (a uuid4 unless given),
`X-Hub-Signature-256` = `sha256=` + HMAC-SHA256 hex of the raw body, `X-Hub-Signature`
(sha1), `User-Agent: GitHub-Hookshot/...`, no redirect followed) and returns loopsweb's
answer (status, body text); `bad_signature` signs with another secret; `sign(secret, body)`
is the header's value. Each delivery is in `deliveries`. `set_hook(url, secret)` names the
repository's webhook for `deliver(event, payload)` and the control channel.

Run as a script (`python -m tests.forge_standin [RECORD_FILE] [--remote-git-dir PATH]`) it
serves until killed, printing its URL on the first line and appending each GitHub request as
a JSON line to RECORD_FILE. A test in another process drives it through paths under
`/_standin/` (never GitHub's, never recorded; tests/forge_control.py has them all):
`POST /_standin/hook {url, secret}` names the webhook, `POST /_standin/review {number, state,
body}` adds a review and sends `pull_request_review` (and so `review_comment`, `check_run`,
`check_suite`, `issue`, `pull_request`), `POST /_standin/webhook {event, payload}` sends any
payload, `POST /_standin/head {number, sha}` moves a head, `GET /_standin/deliveries` lists
what was sent.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import hmac
import http.client
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from tests import forge_control, forge_rest
from tests.forge_payloads import (
    check_run_object,
    issue_object,
    next_id,
    now,
    review_comment_object,
    review_object,
)
from tests.forge_rest import NOT_COLLABORATOR

RATE_LIMIT = 5000
HOOK_ID = 424242
REVIEW_STATES = {"APPROVED", "CHANGES_REQUESTED", "COMMENTED", "DISMISSED", "PENDING"}
__all__ = ["NOT_COLLABORATOR", "Forge", "sign", "start_forge"]


def sign(secret: str, body: bytes, digest: str = "sha256") -> str:
    """A webhook signature header as GitHub computes it: `sha256=` and the HMAC hex digest
    of the raw body keyed with the webhook's secret (`sha1` for `X-Hub-Signature`)."""
    return f"{digest}=" + hmac.new(secret.encode(), body, digest).hexdigest()


def _header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    wanted = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in wanted or etag.removeprefix("W/") in wanted


def _int(params: dict[str, str], name: str, default: int) -> int:
    try:
        return int(params.get(name) or default)
    except ValueError:
        return default


@dataclass
class Forge:
    requests: list[dict[str, Any]] = field(default_factory=list)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    record_file: str | None = None
    # Logins a review may be requested from (None: anyone).
    collaborators: set[str] | None = None
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The bare repository loopsweb pushes to: pull request heads are read from it.
    remote_git_dir: str | None = None
    # The token's user: the author of the pull requests and comments loopsweb makes.
    login: str = "loopsweb-bot"
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    reviews: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    review_comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    check_runs: list[dict[str, Any]] = field(default_factory=list)
    head_overrides: dict[int, str] = field(default_factory=dict)
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    hook: tuple[str, str] | None = None  # (url, secret) of the repository's webhook
    not_modified: int = 0
    _headers: dict[str, str] = field(default_factory=dict, repr=False)

    # --- what tests do ------------------------------------------------------------------

    def fail_next(self, status: int, body: dict[str, Any], times: int = 1) -> None:
        with self.lock:
            self.failures += [(status, body)] * times

    def set_state(self, number: int, state: str, *, merged: bool = False) -> None:
        with self.lock:
            pull = self.pulls[number]
            stamp = now() if state == "closed" else None
            pull.update(state=state, merged=merged)
            if "closed_at" in pull or "merged_at" in pull:
                pull.update(closed_at=stamp, merged_at=stamp if merged else None)

    def set_head(self, number: int, sha: str | None) -> None:
        """Move a pull request's head as a push by someone else would (None: read the
        remote's ref again)."""
        with self.lock:
            if sha is None:
                self.head_overrides.pop(number, None)
            else:
                self.head_overrides[number] = sha
            self.served(self.pulls[number])

    def pull(self, number: int) -> dict[str, Any]:
        """The pull request as served now (its head read), a copy."""
        with self.lock:
            return copy.deepcopy(self.served(self.pulls[number]))

    def add_review(
        self,
        number: int,
        state: str,
        body: str | None,
        commit_id: str | None = None,
        login: str = "mona",
    ) -> dict[str, Any]:
        if state.upper() not in REVIEW_STATES:
            raise ValueError(f"a review's state is one of {sorted(REVIEW_STATES)}")
        with self.lock:
            pull = self.served(self.pulls[number])
            review = review_object(
                pull,
                review_id=next_id(),
                state=state.upper(),
                body=body,
                commit_id=commit_id or pull["head"]["sha"],
                login=login,
            )
            self.reviews.setdefault(number, []).append(review)
            return copy.deepcopy(review)

    def add_review_comment(
        self,
        number: int,
        body: str,
        path: str,
        line: int,
        commit_id: str | None = None,
        *,
        login: str = "mona",
        review_id: int | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            pull = self.served(self.pulls[number])
            comment = review_comment_object(
                pull,
                comment_id=next_id(),
                body=body,
                path=path,
                line=int(line),
                commit_id=commit_id or pull["head"]["sha"],
                login=login,
                review_id=review_id,
            )
            self.review_comments.setdefault(number, []).append(comment)
            return copy.deepcopy(comment)

    def add_check_run(
        self,
        number: int,
        name: str,
        conclusion: str | None,
        summary: str = "",
        details_url: str | None = None,
        *,
        head_sha: str | None = None,
        title: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            pull = self.served(self.pulls[number])
            run = check_run_object(
                pull,
                check_run_id=next_id(),
                name=name,
                conclusion=conclusion,
                sha=head_sha or pull["head"]["sha"],
                summary=summary,
                details_url=details_url,
                title=title,
            )
            self.check_runs.append(run)
            return copy.deepcopy(run)

    def add_issue(
        self,
        repo: str,
        title: str,
        body: str | None = "",
        labels: Iterable[str] = (),
        *,
        number: int | None = None,
        state: str = "open",
        login: str = "mona",
    ) -> dict[str, Any]:
        """An issue (a new number unless given; a given one is replaced)."""
        with self.lock:
            number = number if number is not None else self.next_number()
            issue = issue_object(
                repo, number, title, body, labels, state=state, login=login
            )
            self.issues[number] = issue
            return copy.deepcopy(issue)

    # --- webhooks -----------------------------------------------------------------------

    def set_hook(self, url: str, secret: str) -> None:
        with self.lock:
            self.hook = (url, secret)

    def deliver(
        self,
        event: str,
        payload: dict[str, Any],
        *,
        delivery_id: str | None = None,
        bad_signature: bool = False,
    ) -> dict[str, Any] | None:
        """Send to the repository's webhook (`set_hook`): the delivery's record, or None
        with no webhook set."""
        if self.hook is None:
            return None
        url, secret = self.hook
        return self._send(url, event, payload, secret, delivery_id, bad_signature)

    def send_webhook(
        self,
        url: str,
        event: str,
        payload: dict[str, Any],
        *,
        secret: str,
        delivery_id: str | None = None,
        bad_signature: bool = False,
        timeout: float = 120.0,
    ) -> tuple[int, str]:
        record = self._send(
            url, event, payload, secret, delivery_id, bad_signature, timeout
        )
        return record["status"], record["body"]

    def _send(
        self,
        url: str,
        event: str,
        payload: dict[str, Any],
        secret: str,
        delivery_id: str | None,
        bad_signature: bool,
        timeout: float = 120.0,
    ) -> dict[str, Any]:
        # Never under the lock: loopsweb may call the REST API while it answers.
        data = json.dumps(payload, separators=(",", ":")).encode()
        key = secret + ":not-the-secret" if bad_signature else secret
        delivery = delivery_id or str(uuid.uuid4())
        repo_id = (payload.get("repository") or {}).get("id", 0)
        headers = {
            "Accept": "*/*",
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/standin",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-GitHub-Hook-ID": str(HOOK_ID),
            "X-GitHub-Hook-Installation-Target-Type": "repository",
            "X-GitHub-Hook-Installation-Target-ID": str(repo_id),
            "X-Hub-Signature": sign(key, data, "sha1"),
            "X-Hub-Signature-256": sign(key, data),
        }
        # http.client as is: the headers spelled as GitHub spells them, no proxy, and a
        # redirect is the delivery's answer (GitHub follows none).
        target = urlsplit(url)
        connection_type = (
            http.client.HTTPSConnection
            if target.scheme == "https"
            else http.client.HTTPConnection
        )
        connection = connection_type(target.netloc, timeout=timeout)
        try:
            path = (target.path or "/") + (f"?{target.query}" if target.query else "")
            connection.request("POST", path, body=data, headers=headers)
            answer = connection.getresponse()
            status, text = answer.status, answer.read().decode("utf-8", "replace")
        finally:
            connection.close()
        record = {
            "event": event,
            "delivery_id": delivery,
            "action": payload.get("action"),
            "status": status,
            "body": text,
            "bad_signature": bad_signature,
        }
        with self.lock:
            self.deliveries.append(record)
        return dict(record)

    # --- the REST API -------------------------------------------------------------------

    def answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        """The status and the JSON answer (None for a 304) of one request."""
        status, _, data = self.exchange(method, path, headers, body)
        return status, json.loads(data) if data else None

    def exchange(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """One request: its status, the headers GitHub would add, and the body."""
        parts = urlsplit(path)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        if_none_match = _header(headers, "If-None-Match")
        with self.lock:
            self._headers = {}
            if self.failures:
                status, answer = self.failures.pop(0)
            else:
                status, answer = forge_rest.route(
                    self, method, parts.path, parts.query, payload
                )
            data = json.dumps(answer).encode()
            extra = dict(self._headers)
            if method == "GET" and status == 200:
                extra["ETag"] = f'W/"{hashlib.sha256(data).hexdigest()}"'
                if _matches(if_none_match, extra["ETag"]):
                    status, data = 304, b""
                    self.not_modified += 1
            entry = {
                "method": method,
                "path": parts.path,
                "query": parts.query,
                "authorization": headers.get("Authorization"),
                "body": payload,
                "status": status,
                "if_none_match": if_none_match,
            }
            self.requests.append(entry)
            used = sum(1 for r in self.requests if r["status"] != 304)
            extra |= {
                "X-RateLimit-Limit": str(RATE_LIMIT),
                "X-RateLimit-Remaining": str(max(RATE_LIMIT - used, 0)),
                "X-RateLimit-Used": str(used),
                "X-RateLimit-Resource": "core",
            }
            if self.record_file:
                with open(self.record_file, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(entry) + "\n")
        return status, extra, data

    # --- for the routes (tests/forge_rest.py), under the lock ----------------------------

    def next_number(self) -> int:
        return max([0, *self.pulls, *self.issues]) + 1

    def git_sha(self, ref: Any) -> str | None:
        if not self.remote_git_dir or not isinstance(ref, str) or not ref:
            return None
        found = subprocess.run(
            ["git", "--git-dir", self.remote_git_dir, "rev-parse", "--verify"]
            + ["--quiet", f"refs/heads/{ref}^{{commit}}"],
            capture_output=True,
            text=True,
            check=False,
        )
        return (found.stdout.strip() or None) if found.returncode == 0 else None

    def served(self, pull: dict[str, Any]) -> dict[str, Any]:
        head = pull.get("head")
        if isinstance(head, dict):
            sha = self.head_overrides.get(pull["number"]) or self.git_sha(
                head.get("ref")
            )
            if sha:
                head["sha"] = sha
        return pull

    def page(
        self, items: list[dict[str, Any]], params: dict[str, str], path: str
    ) -> list[dict[str, Any]]:
        per_page = min(max(_int(params, "per_page", 30), 1), 100)
        page = max(_int(params, "page", 1), 1)
        last = max(1, -(-len(items) // per_page))
        if page < last:
            links = [(page + 1, "next"), (last, "last")]
            self._headers["Link"] = ", ".join(
                f'<{self.url}{path}?{urlencode({**params, "page": n})}>; rel="{rel}"'
                for n, rel in links
            )
        return items[(page - 1) * per_page : page * per_page]


def start_forge(
    record_file: str | None = None, *, remote_git_dir: str | None = None
) -> tuple[Forge, ThreadingHTTPServer]:
    forge = Forge(record_file=record_file, remote_git_dir=remote_git_dir)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            headers: dict[str, str] = {}
            if urlsplit(self.path).path.startswith(forge_control.PREFIX):
                status, answer = forge_control.control(
                    forge, self.command, self.path, body
                )
                data = json.dumps(answer).encode()
            else:
                status, headers, data = forge.exchange(
                    self.command, self.path, dict(self.headers), body
                )
            self.send_response(status)
            if status != 304:
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    forge.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return forge, server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.forge_standin",
        description="The GitHub stand-in: serves until killed, its URL on the first line.",
    )
    parser.add_argument("record_file", nargs="?", help="append each request here")
    parser.add_argument("--remote-git-dir", help="the bare repository pushes go to")
    args = parser.parse_args(argv)
    if args.remote_git_dir and not Path(args.remote_git_dir).is_dir():
        parser.error(f"--remote-git-dir {args.remote_git_dir} is not a directory")
    standin, _ = start_forge(args.record_file, remote_git_dir=args.remote_git_dir)
    print(standin.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
