"""A GitHub stand-in for the tests (issue 40): a standard library HTTP server on 127.0.0.1
that answers the REST calls delivery makes as GitHub does and records each request with its
token. Point LOOPSWEB_GITHUB_API_URL at `url`.

    POST /repos/{owner}/{repo}/pulls  -> 201 {number, html_url, state, draft, head, base}
    GET  /repos/{owner}/{repo}/pulls/{number} -> 200 the pull request, or 404
    GET  /repos/{owner}/{repo}/pulls?head=OWNER:BRANCH -> 200 [pull requests]
    POST /repos/{owner}/{repo}/pulls/{number}/requested_reviewers {reviewers} -> 201 the
         pull request with `requested_reviewers` [{login}]; 422 as GitHub words it for a
         login not in `collaborators` (when that is set); 404 for no such pull request

`fail_next(status, body)` makes the next calls answer an error as GitHub would (401 "Bad
credentials", 422 with `errors`, 502); `set_state(number, state, merged)` moves a pull
request. Run as a script (`python -m tests.forge_standin RECORD_FILE`) it serves until
killed, printing its URL on the first line and appending each request as a JSON line to
RECORD_FILE (for tests through real processes).
"""

from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_PULLS = re.compile(r"^/repos/([^/]+)/([^/]+)/pulls(?:/(\d+))?$")
_REVIEWERS = re.compile(r"^/repos/([^/]+)/([^/]+)/pulls/(\d+)/requested_reviewers$")
NOT_COLLABORATOR = (
    "Reviews may only be requested from collaborators. One or more of the users or "
    "teams you specified is not a collaborator of the {owner}/{repo} repository."
)


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

    def fail_next(self, status: int, body: dict[str, Any], times: int = 1) -> None:
        with self.lock:
            self.failures += [(status, body)] * times

    def set_state(self, number: int, state: str, *, merged: bool = False) -> None:
        with self.lock:
            self.pulls[number].update(state=state, merged=merged)

    def answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        parts = urlsplit(path)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        with self.lock:
            entry = {
                "method": method,
                "path": parts.path,
                "query": parts.query,
                "authorization": headers.get("Authorization"),
                "body": payload,
            }
            self.requests.append(entry)
            if self.record_file:
                with open(self.record_file, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(entry) + "\n")
            if self.failures:
                return self.failures.pop(0)
            return self._route(method, parts.path, parts.query, payload)

    def _route(
        self, method: str, path: str, query: str, payload: Any
    ) -> tuple[int, Any]:
        reviewers = _REVIEWERS.match(path)
        if reviewers is not None and method == "POST":
            owner, repo, number = reviewers.groups()
            return self._request_reviewers(owner, repo, number, payload)
        match = _PULLS.match(path)
        if match is None:
            return 404, {"message": "Not Found"}
        owner, repo, number = match.groups()
        if method == "POST" and number is None:
            if not isinstance(payload, dict) or not payload.get("head"):
                return 422, {
                    "message": "Validation Failed",
                    "errors": [{"message": "head missing"}],
                }
            if any(p["head"]["ref"] == payload["head"] for p in self.pulls.values()):
                return 422, {
                    "message": "Validation Failed",
                    "errors": [
                        {
                            "message": f"A pull request already exists for {owner}:{payload['head']}."
                        }
                    ],
                }
            new = len(self.pulls) + 1
            self.pulls[new] = {
                "number": new,
                "html_url": f"https://github.example/{owner}/{repo}/pull/{new}",
                "state": "open",
                "merged": False,
                "draft": bool(payload.get("draft")),
                "title": payload.get("title"),
                "body": payload.get("body"),
                "head": {"ref": payload["head"], "sha": "0" * 40},
                "base": {"ref": payload.get("base")},
            }
            return 201, self.pulls[new]
        if method == "GET" and number is not None:
            found = self.pulls.get(int(number))
            return (200, found) if found else (404, {"message": "Not Found"})
        if method == "GET":
            head = (parse_qs(query).get("head") or [""])[0].split(":")[-1]
            return 200, [
                p for p in self.pulls.values() if not head or p["head"]["ref"] == head
            ]
        return 404, {"message": "Not Found"}

    def _request_reviewers(
        self, owner: str, repo: str, number: str, payload: Any
    ) -> tuple[int, Any]:
        pull = self.pulls.get(int(number))
        if pull is None:
            return 404, {"message": "Not Found"}
        logins = payload.get("reviewers") if isinstance(payload, dict) else None
        if not isinstance(logins, list):
            return 422, {"message": "Invalid request.", "errors": []}
        if self.collaborators is not None and set(logins) - self.collaborators:
            return 422, {"message": NOT_COLLABORATOR.format(owner=owner, repo=repo)}
        have = pull.setdefault("requested_reviewers", [])
        have += [{"login": x} for x in logins if {"login": x} not in have]
        return 201, pull


def start_forge(record_file: str | None = None) -> tuple[Forge, ThreadingHTTPServer]:
    forge = Forge(record_file=record_file)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            status, answer = forge.answer(
                self.command, self.path, dict(self.headers), body
            )
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    forge.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return forge, server


if __name__ == "__main__":
    standin, http_server = start_forge(sys.argv[1] if len(sys.argv) > 1 else None)
    print(standin.url, flush=True)
    threading.Event().wait()
