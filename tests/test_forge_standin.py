"""The GitHub stand-in (tests/forge_standin.py, tests/forge_rest.py, tests/forge_payloads.py,
tests/forge_control.py) answers and sends as GitHub does: webhooks signed with the secret
(GitHub's own example vector), a bad signature that is wrong, the REST routes' statuses and
shapes, conditional requests (ETag, 304 counted apart), a pull request's head read from a
real bare repository's ref, the control channel, the script mode, and the API the delivery
and review gate tests use, unchanged. No database."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

import pytest

from tests.forge_payloads import issue_payload, review_payload
from tests.forge_standin import Forge, sign, start_forge
from tests.processes import ROOT, stop_process_group
from tests.waiting import wait_for

SECRET = "s3cret-of-the-hook"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def standin() -> Iterator[Forge]:
    forge, server = start_forge()
    try:
        yield forge
    finally:
        server.shutdown()
        server.server_close()


class Receiver:
    """loopsweb's end of a webhook: records each delivery; `/refuse` answers 401, `/moved`
    301."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str], bytes]] = []
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                got.append((self.path, dict(self.headers), raw))
                status = {"/refuse": 401, "/moved": 301}.get(self.path, 202)
                data = json.dumps({"status": status}).encode()
                self.send_response(status)
                if status == 301:
                    self.send_header("Location", "/hooks/github/")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hooks = Receiver()
    try:
        yield hooks
    finally:
        hooks.server.shutdown()
        hooks.server.server_close()


def call(
    forge: Forge,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    repo = "" if path.startswith("/_standin/") else "/repos/acme/widgets"
    request = urllib.request.Request(
        forge.url + repo + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": "Bearer ghp_t", **(headers or {})},
    )
    try:
        with _OPENER.open(request, timeout=60) as answer:
            status, got, raw = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        status, got, raw = exc.code, dict(exc.headers), exc.read()
    return status, got, json.loads(raw) if raw else None


def get(forge: Forge, path: str) -> Any:
    return call(forge, "GET", path)[2]


def status_of(forge: Forge, method: str, path: str, body: Any = None) -> int:
    return call(forge, method, path, body)[0]


def open_pull(forge: Forge, head: str = "feature") -> dict[str, Any]:
    status, _, pull = call(
        forge,
        "POST",
        "/pulls",
        {"title": "T", "head": head, "base": "main", "body": "B", "draft": False},
    )
    assert status == 201
    return pull


# --- webhooks ---------------------------------------------------------------------------


def test_sign_gives_githubs_own_example_signature() -> None:
    # docs.github.com, "Validating webhook deliveries", "Testing the webhook payload
    # validation".
    assert sign("It's a Secret to Everybody", b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


def test_a_webhook_is_posted_signed_with_the_secret_as_github_posts_it(
    standin: Forge, receiver: Receiver
) -> None:
    pull = open_pull(standin)
    payload = review_payload(
        standin.pull(pull["number"]), "CHANGES_REQUESTED", "Fix it", review_id=7
    )
    status, body = standin.send_webhook(
        receiver.url + "/hooks/github/", "pull_request_review", payload, secret=SECRET
    )
    assert (status, json.loads(body)) == (202, {"status": 202})
    [(path, headers, raw)] = receiver.got
    assert path == "/hooks/github/"
    expected = hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
    assert headers["X-Hub-Signature-256"] == f"sha256={expected}"
    assert headers["X-GitHub-Event"] == "pull_request_review"
    assert uuid.UUID(headers["X-GitHub-Delivery"]).version == 4
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"].startswith("GitHub-Hookshot/")
    assert json.loads(raw) == payload
    [record] = standin.deliveries
    assert record["delivery_id"] == headers["X-GitHub-Delivery"]
    assert (record["event"], record["action"], record["status"]) == (
        "pull_request_review",
        "submitted",
        202,
    )


def test_a_given_delivery_id_is_sent_and_a_bad_signature_does_not_verify(
    standin: Forge, receiver: Receiver
) -> None:
    payload = issue_payload("opened", "acme/widgets", 5, "Bug", "It breaks", ["bug"])
    for bad in (False, True):
        standin.send_webhook(
            receiver.url,
            "issues",
            payload,
            secret=SECRET,
            delivery_id="delivery-1",
            bad_signature=bad,
        )
    (_, good, raw), (_, forged, raw_again) = receiver.got
    assert raw == raw_again
    assert good["X-GitHub-Delivery"] == forged["X-GitHub-Delivery"] == "delivery-1"
    assert good["X-Hub-Signature-256"] == sign(SECRET, raw)
    signature = forged["X-Hub-Signature-256"]
    assert signature.startswith("sha256=") and len(signature) == len("sha256=") + 64
    assert signature != sign(SECRET, raw)


def test_a_refusal_and_a_redirect_are_the_answer_and_no_redirect_is_followed(
    standin: Forge, receiver: Receiver
) -> None:
    payload = issue_payload(
        "closed", "acme/widgets", 5, "Bug", None, [], state="closed"
    )
    refused = standin.send_webhook(
        receiver.url + "/refuse", "issues", payload, secret=SECRET
    )
    moved = standin.send_webhook(
        receiver.url + "/moved", "issues", payload, secret=SECRET
    )
    assert (refused[0], moved[0]) == (401, 301)
    assert json.loads(refused[1]) == {"status": 401}
    assert [path for path, _, _ in receiver.got] == ["/refuse", "/moved"]


# --- the REST routes ----------------------------------------------------------------------


def test_pull_requests_are_listed_by_state_newest_first_and_patched(
    standin: Forge,
) -> None:
    first, second = open_pull(standin, "one"), open_pull(standin, "two")
    assert (first["number"], second["number"]) == (1, 2)
    assert first["user"]["login"] == "loopsweb-bot" and first["labels"] == []
    status, _, listed = call(standin, "GET", "/pulls?state=open")
    assert status == 200 and [p["number"] for p in listed] == [2, 1]
    status, _, closed = call(
        standin, "PATCH", "/pulls/1", {"state": "closed", "title": "X"}
    )
    assert status == 200 and (closed["state"], closed["title"]) == ("closed", "X")
    assert closed["closed_at"] and closed["merged"] is False
    assert [p["number"] for p in get(standin, "/pulls")] == [2]
    by_state = {
        state: [p["number"] for p in get(standin, f"/pulls?state={state}")]
        for state in ("closed", "all")
    }
    assert by_state == {"closed": [1], "all": [2, 1]}
    assert status_of(standin, "GET", "/pulls?state=shut") == 422
    assert status_of(standin, "PATCH", "/pulls/1", {"state": "gone"}) == 422
    assert status_of(standin, "PATCH", "/pulls/9", {"state": "open"}) == 404
    # A closed pull request's head may have a new one.
    assert open_pull(standin, "one")["number"] == 3
    status, headers, page = call(standin, "GET", "/pulls?state=all&per_page=2")
    assert [p["number"] for p in page] == [3, 2]
    assert 'rel="next"' in headers["Link"] and "page=2" in headers["Link"]


def test_reviews_review_comments_and_check_runs_are_listed_as_added(
    standin: Forge,
) -> None:
    open_pull(standin)
    standin.set_head(1, "d" * 40)
    review = standin.add_review(1, "changes_requested", "Rename it", login="hubot")
    comment = standin.add_review_comment(1, "Typo", "README.md", 3)
    old = standin.add_check_run(1, "tests", "failure", "1 failed", head_sha="e" * 40)
    standin.add_check_run(1, "tests", "failure", "3 failed")
    newest = standin.add_check_run(1, "tests", "success", "all passed")
    lint = standin.add_check_run(1, "lint", "timed_out", details_url="https://ci/9")
    status, _, reviews = call(standin, "GET", "/pulls/1/reviews")
    assert status == 200 and reviews == [review]
    assert (review["state"], review["body"], review["commit_id"]) == (
        "CHANGES_REQUESTED",
        "Rename it",
        "d" * 40,
    )
    assert review["user"]["login"] == "hubot"
    status, _, comments = call(standin, "GET", "/pulls/1/comments")
    assert status == 200 and comments == [comment]
    assert (comment["path"], comment["line"], comment["commit_id"]) == (
        "README.md",
        3,
        "d" * 40,
    )
    status, _, runs = call(standin, "GET", f"/commits/{'d' * 40}/check-runs")
    assert status == 200 and runs["total_count"] == 2
    assert [r["id"] for r in runs["check_runs"]] == [lint["id"], newest["id"]]
    assert lint["details_url"] == "https://ci/9" and lint["conclusion"] == "timed_out"
    every = get(standin, f"/commits/{'d' * 40}/check-runs?filter=all")
    assert every["total_count"] == 3
    by_branch = get(standin, "/commits/feature/check-runs")
    assert by_branch == runs
    older = get(standin, f"/commits/{'e' * 40}/check-runs")
    assert older["check_runs"] == [old]
    assert status_of(standin, "GET", "/pulls/7/reviews") == 404
    with pytest.raises(ValueError):
        standin.add_review(1, "LOOKS_FINE", "")


def test_a_get_answers_an_etag_and_a_matching_if_none_match_304_counted_apart(
    standin: Forge,
) -> None:
    open_pull(standin)
    path = "/pulls/1/reviews"
    status, headers, _ = call(standin, "GET", path)
    etag = headers["ETag"]
    assert status == 200 and etag.startswith('W/"')
    assert headers["X-RateLimit-Used"] == "2"
    status, headers, body = call(standin, "GET", path, headers={"If-None-Match": etag})
    assert (status, body, headers["ETag"]) == (304, None, etag)
    assert headers["X-RateLimit-Used"] == "2"  # a 304 does not count
    assert standin.not_modified == 1
    last = standin.requests[-1]
    assert (last["status"], last["if_none_match"]) == (304, etag)
    assert standin.requests[-2]["status"] == 200
    assert standin.requests[-2]["if_none_match"] is None
    standin.add_review(1, "APPROVED", "Fine")
    status, headers, body = call(standin, "GET", path, headers={"If-None-Match": etag})
    assert status == 200 and headers["ETag"] != etag and len(body) == 1
    # The pull request's own answer changes with its head.
    status, headers, _ = call(standin, "GET", "/pulls/1")
    standin.set_head(1, "f" * 40)
    moved = call(standin, "GET", "/pulls/1", headers={"If-None-Match": headers["ETag"]})
    assert moved[0] == 200 and moved[2]["head"]["sha"] == "f" * 40
    assert standin.not_modified == 1


def test_issue_comments_and_labels_on_a_pull_request_and_an_issue(
    standin: Forge,
) -> None:
    open_pull(standin)
    issue = standin.add_issue("acme/widgets", "Bug", "It breaks", ["bug"])
    assert issue["number"] == 2
    status, _, comment = call(
        standin, "POST", "/issues/1/comments", {"body": "needs a human"}
    )
    assert status == 201 and comment["body"] == "needs a human"
    assert comment["html_url"] == (
        f"https://github.example/acme/widgets/pull/1#issuecomment-{comment['id']}"
    )
    assert comment["user"]["login"] == "loopsweb-bot"
    assert get(standin, "/issues/1/comments") == [comment]
    assert get(standin, "/issues/2/comments") == []
    for labels in (["needs-human"], ["needs-human", "loop"]):
        status, _, answer = call(
            standin, "POST", "/issues/1/labels", {"labels": labels}
        )
        assert status == 200
    assert [x["name"] for x in answer] == ["needs-human", "loop"]
    assert [x["name"] for x in standin.pull(1)["labels"]] == ["needs-human", "loop"]
    status, _, left = call(standin, "DELETE", "/issues/1/labels/needs-human")
    assert status == 200 and [x["name"] for x in left] == ["loop"]
    assert status_of(standin, "DELETE", "/issues/1/labels/needs-human") == 404
    status, _, on_issue = call(
        standin, "POST", "/issues/2/labels", {"labels": ["loop"]}
    )
    assert [x["name"] for x in on_issue] == ["bug", "loop"]
    status, _, shown = call(standin, "GET", "/issues/1")
    assert status == 200 and shown["pull_request"]["html_url"].endswith("/pull/1")
    bad = [
        call(standin, "POST", "/issues/1/comments", {"body": ""}),
        call(standin, "POST", "/issues/1/labels", {"labels": [3]}),
        call(standin, "POST", "/issues/9/comments", {"body": "x"}),
    ]
    assert [status for status, _, _ in bad] == [422, 422, 404]


# --- the API the delivery and review gate tests use -----------------------------------


def test_the_existing_api_answers_as_before(standin: Forge, tmp_path: Path) -> None:
    standin.record_file = str(tmp_path / "record.jsonl")
    pull = open_pull(standin, "loopsweb/run-1")
    assert (pull["number"], pull["state"], pull["draft"]) == (1, "open", False)
    assert pull["html_url"] == "https://github.example/acme/widgets/pull/1"
    assert pull["head"]["ref"] == "loopsweb/run-1" and pull["head"]["sha"] == "0" * 40
    again = call(standin, "POST", "/pulls", {"head": "loopsweb/run-1", "base": "main"})
    assert again[0] == 422 and "already exists" in again[2]["errors"][0]["message"]
    assert status_of(standin, "POST", "/pulls", {"base": "main"}) == 422
    query = "head=acme%3Aloopsweb%2Frun-1&state=all"
    found = get(standin, f"/pulls?{query}")
    assert [p["number"] for p in found] == [1]
    standin.collaborators = {"mona"}
    refused = call(
        standin,
        "POST",
        "/pulls/1/requested_reviewers",
        {"reviewers": ["mona", "stranger"]},
    )
    assert (
        refused[0] == 422
        and "not a collaborator of the acme/widgets" in (refused[2]["message"])
    )
    asked = call(
        standin, "POST", "/pulls/1/requested_reviewers", {"reviewers": ["mona"]}
    )
    assert asked[0] == 201 and asked[2]["requested_reviewers"] == [{"login": "mona"}]
    standin.fail_next(401, {"message": "Bad credentials"})
    assert call(standin, "GET", "/pulls/1")[:3:2] == (
        401,
        {"message": "Bad credentials"},
    )
    standin.set_state(1, "closed", merged=True)
    shown = get(standin, "/pulls/1")
    assert (shown["state"], shown["merged"]) == ("closed", True)
    assert status_of(standin, "GET", "/nothing") == 404
    status, answer = standin.answer("GET", "/repos/acme/widgets/pulls/1", {}, b"")
    assert status == 200 and answer["number"] == 1
    lines = [json.loads(x) for x in Path(standin.record_file).read_text().splitlines()]
    assert lines == standin.requests
    assert lines[0]["method"] == "POST" and lines[0]["authorization"] == "Bearer ghp_t"
    assert [x["status"] for x in lines] == [
        201,
        422,
        422,
        200,
        422,
        201,
        401,
        200,
        404,
        200,
    ]


# --- the control channel ---------------------------------------------------------------


def test_the_control_channel_adds_and_sends_and_is_not_recorded(
    standin: Forge, receiver: Receiver
) -> None:
    open_pull(standin)
    before = len(standin.requests)
    nothing = call(
        standin, "POST", "/_standin/review", {"number": 1, "state": "COMMENTED"}
    )
    assert nothing[0] == 201 and nothing[2]["delivery"] is None  # no hook yet
    hook = {"url": receiver.url + "/hooks/github/", "secret": SECRET}
    assert status_of(standin, "POST", "/_standin/hook", hook) == 200
    status, _, answer = call(
        standin,
        "POST",
        "/_standin/review",
        {"number": 1, "state": "CHANGES_REQUESTED", "body": "Redo", "login": "hubot"},
    )
    assert status == 201 and answer["delivery"]["status"] == 202
    [(_, headers, raw)] = receiver.got
    assert headers["X-Hub-Signature-256"] == sign(SECRET, raw)
    sent = json.loads(raw)
    assert sent["review"]["id"] == answer["review"]["id"]
    assert sent["review"]["state"] == "changes_requested"
    listed = get(standin, "/pulls/1/reviews")
    assert [r["state"] for r in listed] == ["COMMENTED", "CHANGES_REQUESTED"]
    run = call(
        standin,
        "POST",
        "/_standin/check_run",
        {"number": 1, "name": "tests", "conclusion": "failure", "summary": "boom"},
    )[2]
    assert json.loads(receiver.got[-1][2])["check_run"]["id"] == run["check_run"]["id"]
    redelivered = call(
        standin,
        "POST",
        "/_standin/pull_request",
        {"number": 1, "action": "closed", "merged": True, "delivery_id": "d-1"},
    )[2]
    assert redelivered["pull_request"]["merged"] is True
    assert receiver.got[-1][1]["X-GitHub-Delivery"] == "d-1"
    forged = call(
        standin,
        "POST",
        "/_standin/webhook",
        {"event": "ping", "payload": {"zen": "Keep it simple."}, "bad_signature": True},
    )[2]
    assert forged["delivery"]["bad_signature"] is True
    assert receiver.got[-1][1]["X-Hub-Signature-256"] != sign(
        SECRET, receiver.got[-1][2]
    )
    bad = [
        call(standin, "POST", "/_standin/review", {"number": 9, "state": "APPROVED"}),
        call(standin, "POST", "/_standin/review", {"number": 1, "state": "MEH"}),
        call(standin, "POST", "/_standin/check_run", {"number": 1}),
        call(standin, "POST", "/_standin/nothing", {}),
    ]
    assert [status for status, _, _ in bad] == [404, 400, 400, 404]
    deliveries = get(standin, "/_standin/deliveries")
    assert [d["event"] for d in deliveries] == [
        "pull_request_review",
        "check_run",
        "pull_request",
        "ping",
    ]
    assert len(standin.requests) == before + 1  # the one GET of the reviews


# --- a real bare repository and the script ------------------------------------------------


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _repository(tmp_path: Path) -> tuple[Path, Path]:
    """A bare remote and a clone with `main` and `feature` pushed."""
    remote, work = tmp_path / "origin.git", tmp_path / "work"
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    _git(tmp_path, "init", "-q", "-b", "main", str(work))
    for key, value in (("user.name", "T"), ("user.email", "t@example.com")):
        _git(work, "config", key, value)
    _git(work, "remote", "add", "origin", str(remote))
    _git(work, "commit", "-q", "--allow-empty", "-m", "first")
    _git(work, "push", "-q", "origin", "main", "main:feature")
    return remote, work


@pytest.mark.slow
def test_a_pull_requests_head_follows_the_pushes_to_the_bare_repository(
    tmp_path: Path,
) -> None:
    remote, work = _repository(tmp_path)
    forge, server = start_forge(remote_git_dir=str(remote))
    try:
        pull = open_pull(forge)
        first = _git(remote, "rev-parse", "refs/heads/feature")
        assert pull["head"]["sha"] == first
        assert pull["base"]["sha"] == _git(remote, "rev-parse", "refs/heads/main")
        _git(work, "commit", "-q", "--allow-empty", "-m", "second")
        _git(work, "push", "-q", "origin", "main:feature")
        second = _git(remote, "rev-parse", "refs/heads/feature")
        assert second != first
        assert get(forge, "/pulls/1")["head"]["sha"] == second
        listed = get(forge, "/pulls")
        assert listed[0]["head"]["sha"] == second
        forge.set_head(1, "a" * 40)  # a human's push, as the test says
        assert get(forge, "/pulls/1")["head"]["sha"] == "a" * 40
        assert forge.add_check_run(1, "tests", "failure")["head_sha"] == "a" * 40
        forge.set_head(1, None)
        assert forge.pull(1)["head"]["sha"] == second
        assert (
            review_payload(forge.pull(1), "APPROVED", "")["review"]["commit_id"]
            == second
        )
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_the_script_serves_records_and_is_driven_through_the_control_channel(
    tmp_path: Path, receiver: Receiver
) -> None:
    remote, _ = _repository(tmp_path)
    record, log = tmp_path / "record.jsonl", tmp_path / "forge.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forge_standin", str(record)]
            + ["--remote-git-dir", str(remote)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = wait_for(
            lambda: (
                log.read_text().split("\n", 1)[0] if "\n" in log.read_text() else None
            ),
            what="the forge stand-in's URL",
        )
        remote_forge = Forge(url=url)
        pull = open_pull(remote_forge)
        assert pull["head"]["sha"] == _git(remote, "rev-parse", "refs/heads/feature")
        hook = {"url": receiver.url + "/hooks/github/", "secret": SECRET}
        call(remote_forge, "POST", "/_standin/hook", hook)
        status, _, answer = call(
            remote_forge,
            "POST",
            "/_standin/review",
            {"number": 1, "state": "APPROVED", "body": "Ship it"},
        )
        assert status == 201 and answer["delivery"]["status"] == 202
        [(_, headers, raw)] = receiver.got
        assert headers["X-Hub-Signature-256"] == sign(SECRET, raw)
        lines = [json.loads(x) for x in record.read_text().splitlines()]
        assert [(x["method"], x["path"], x["status"]) for x in lines] == [
            ("POST", "/repos/acme/widgets/pulls", 201)
        ]
    finally:
        stop_process_group(proc)
    refused = subprocess.run(
        [sys.executable, "-m", "tests.forge_standin"]
        + ["--remote-git-dir", str(tmp_path / "absent")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and "is not a directory" in refused.stderr
