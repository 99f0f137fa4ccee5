"""The loop closes through the processes `make run` starts (docs/revisions.md; issue 60): the
web server answers GitHub's webhooks, the main cluster starts the rounds and sends the
notification, the run cluster runs them with the fake agent; the GitHub stand-in is a process
of its own that serves the REST calls, follows the pushes to the bare `origin`
(`--remote-git-dir`) and SENDS signed webhooks to `POST /hooks/github/`. A second terminal
routes one task with `--deliver pull-request --max-revisions 4`; then, in order:

1. the verifier sends the work back (`VERDICT: changes`): a round, then approve, then ONE pull
   request, the findings in the round's worker prompt;
2. a delivery signed with the wrong secret: 401, nothing written;
3. a review that requests changes: a round told the review, pushed onto the same branch,
   the same pull request updated;
4. ten review comments in a burst: ONE round;
5. a red check: a round told the check's name;
6. changes requested once the budget is spent: `needs_human`, ONE comment and the label on
   the pull request, ONE notification; still one pull request.

The fake agent's worker appends a line to work.txt each round and its verifier's verdict
follows the number of lines, so each verdict also proves its round continued the branch."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ledger.models import (
    RevisionState,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemRevision,
    WorkItemStatus,
)
from routing.models import GithubDelivery
from tests.ledger.runner_helpers import git, git_project, start_installation
from tests.processes import (
    ROOT,
    free_port,
    manage,
    stop_make_run,
    stop_process_group,
    wait_for_http,
    wait_until,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.xdist_group("installation"),
]

TOKEN = "ghp_loop_process_token_0123"
SECRET = "loop-process-webhook-secret"
CHANGES = "Missing a test.\nVERDICT: changes\n- add a test for work.txt"
APPROVE = "VERDICT: approve"


class _Receiver:
    """A notification receiver on 127.0.0.1 (a Slack incoming webhook's stand-in)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        received = self.messages

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                received.append(json.loads(self.rfile.read(size)))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _control(forge_url: str, what: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{forge_url}/_standin/{what}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def _forge(tmp_path: Path, origin: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    record = tmp_path / "forge-requests.jsonl"
    log = tmp_path / "forge.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.forge_standin",
                str(record),
                "--remote-git-dir",
                str(origin),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = wait_until(
        lambda: log.read_text().split("\n", 1)[0] if "\n" in log.read_text() else None,
        timeout=60,
        what="the forge stand-in's URL",
    )
    return proc, url, record


def _secret_file(path: Path, line: str) -> str:
    path.write_text(line + "\n")
    path.chmod(0o600)
    return str(path)


@dataclass
class _Installation:
    """`make run` with the GitHub stand-in (a process following pushes to `origin`), the
    project, and what a second terminal needs."""

    project: Path
    origin: Path
    forge: subprocess.Popen[bytes]
    forge_url: str
    record: Path
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes]
    port: int

    def stop(self) -> None:
        stop_make_run(self.proc)
        stop_process_group(self.forge)

    def forge_requests(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


def _install(tmp_path: Path, steps: dict[str, Any], **extra: str) -> _Installation:
    """The project with a bare `origin`, the fake agent configured by `steps`, the stand-in
    and `make run` with the GitHub token and webhook secret (`extra` added), up."""
    project = git_project(tmp_path / "project")
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(project, "remote", "add", "origin", str(origin))
    git(project, "push", "-q", "origin", "main")
    agent_config = tmp_path / "agent.json"
    agent_config.write_text(json.dumps({"steps": steps}))
    forge, forge_url, record = _forge(tmp_path, origin)
    port = free_port()
    env, log, proc = start_installation(
        tmp_path,
        port,
        FAKE_AGENT_CONFIG=str(agent_config),
        LOOPSWEB_GITHUB_API_URL=forge_url,
        LOOPSWEB_GITHUB_TOKEN_FILE=_secret_file(
            tmp_path / "github.env", f"GITHUB_TOKEN={TOKEN}"
        ),
        LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE=_secret_file(
            tmp_path / "hook.env", f"GITHUB_WEBHOOK_SECRET={SECRET}"
        ),
        **extra,
    )
    up = _Installation(project, origin, forge, forge_url, record, env, log, proc, port)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/admin/login/", timeout=90)
        hook = f"http://127.0.0.1:{port}/hooks/github/"
        _control(forge_url, "hook", {"url": hook, "secret": SECRET})
    except BaseException:
        up.stop()
        raise
    return up


def _worker_prompts(tmp_path: Path) -> list[str]:
    """The fake agent's worker prompts, oldest first (its records are named by its clock)."""
    records = [
        json.loads(p.read_text()) for p in sorted((tmp_path / "records").glob("*.json"))
    ]
    return [r["prompt"] for r in records if r["step"] == "worker"]


def _runs(item_id: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(work_item_id=item_id).order_by("id"))


def _delivered_round(item_id: str, count: int) -> WorkflowRun | None:
    """The item's `count`-th run once it ended and its delivery was tried."""
    runs = _runs(item_id)
    if len(runs) < count:
        return None
    run = runs[count - 1]
    return (
        run
        if (run.delivery_json or {}).get("state") in ("delivered", "failed")
        else None
    )


def test_the_loop_closes_through_the_real_processes(tmp_path: Path) -> None:
    receiver = _Receiver()
    steps = {
        "worker": {"append": "work.txt"},
        "verifier": {
            "outputs_by_lines": {"file": "work.txt", "outputs": [CHANGES, APPROVE]}
        },
    }
    up = _install(
        tmp_path,
        steps,
        LOOPSWEB_REVISION_DEBOUNCE_SECONDS="3",
        LOOPSWEB_NOTIFY_URL=receiver.url,
    )
    project, origin, forge_url, env = up.project, up.origin, up.forge_url, up.env
    try:
        event = {
            "id": "evt-loop-1",
            "type": "build.failed",
            "source": "ci",
            "data": {"project_path": str(project), "title": "Fix the note"},
        }
        routed = manage(
            env,
            "route_event",
            "generic",
            "--event-json",
            json.dumps(event),
            "--deliver",
            "pull-request",
            "--github-repo",
            "acme/widgets",
            "--max-revisions",
            "4",
            "--json",
        )
        item_id = json.loads(routed.stdout)["workItem"]["id"]
        # 1. The verifier sent the work back; the round approved; one pull request.
        second = wait_until(
            lambda: _delivered_round(item_id, 2), timeout=180, what="the first round"
        )
        first = _runs(item_id)[0]
        assert first.delivery_json["state"] == "skipped"
        assert second.delivery_json["state"] == "delivered", second.delivery_json
        branch = second.worktree_branch
        assert second.delivery_json["pr"]["number"] == 1
        assert "add a test for work.txt" in _worker_prompts(tmp_path)[-1]

        # 2. A delivery signed with another secret: refused, nothing written.
        bad = _control(
            forge_url,
            "review",
            {
                "number": 1,
                "state": "changes_requested",
                "body": "x",
                "bad_signature": True,
            },
        )
        assert bad["delivery"]["status"] == 401
        assert not GithubDelivery.objects.exists()
        assert not WorkItemRevision.objects.exclude(trigger="verdict").exists()

        # 3. Changes requested: a round told the review, on the same branch and PR.
        _control(
            forge_url,
            "review",
            {"number": 1, "state": "changes_requested", "body": "Rename the note"},
        )
        third = wait_until(
            lambda: _delivered_round(item_id, 3), timeout=180, what="the review's round"
        )
        assert "Rename the note" in _worker_prompts(tmp_path)[-1]
        assert git(origin, "rev-parse", branch).strip() == third.commit_head
        assert third.delivery_json["pr"]["number"] == 1

        # 4. Ten review comments in a burst: one round.
        for n in range(10):
            sent = _control(
                forge_url,
                "review_comment",
                {"number": 1, "body": f"nit {n}", "path": "work.txt", "line": 1},
            )
            assert sent["delivery"]["status"] == 200, sent
        fourth = wait_until(
            lambda: _delivered_round(item_id, 4), timeout=180, what="the burst's round"
        )
        burst = WorkItemRevision.objects.get(run_id=fourth.id)
        assert len(burst.details["sources"]) == 10
        assert git(origin, "rev-parse", branch).strip() == fourth.commit_head

        # 5. A red check: a round told the check's name.
        _control(
            forge_url,
            "check_run",
            {"number": 1, "name": "ci / unit", "conclusion": "failure"},
        )
        fifth = wait_until(
            lambda: _delivered_round(item_id, 5), timeout=180, what="the check's round"
        )
        assert "Check ci / unit ended failure" in _worker_prompts(tmp_path)[-1]
        assert git(origin, "rev-parse", branch).strip() == fifth.commit_head

        # 6. The budget (4) is spent: a human is told, once.
        _control(
            forge_url,
            "review",
            {"number": 1, "state": "changes_requested", "body": "still wrong"},
        )
        wait_until(
            lambda: (
                WorkflowWorkItem.objects.get(pk=item_id).status
                == WorkItemStatus.NEEDS_HUMAN
            ),
            timeout=120,
            what="the item to need a human",
        )
        wait_until(
            lambda: [m for m in receiver.messages if m.get("kind") == "needs_human"],
            timeout=120,
            what="the notification",
        )
    finally:
        up.stop()
        receiver.stop()
    output = up.log.read_text(errors="replace")
    assert "Traceback" not in output, output[-3000:]
    requests = up.forge_requests()
    opened = [
        r for r in requests if r["method"] == "POST" and r["path"].endswith("/pulls")
    ]
    comments = [r for r in requests if r["path"].endswith("/issues/1/comments")]
    labels = [r for r in requests if r["path"].endswith("/issues/1/labels")]
    assert len(opened) == 1 and len(comments) == 1 and len(labels) == 1
    assert "round 4" in comments[0]["body"]["body"]
    [told] = [m for m in receiver.messages if m.get("kind") == "needs_human"]
    assert "needs a human" in told["text"]
    rounds = WorkItemRevision.objects.filter(state=RevisionState.STARTED).order_by(
        "round"
    )
    assert [r.trigger for r in rounds] == ["verdict", "review", "review", "check"]
    assert len(_runs(item_id)) == 5
    assert GithubDelivery.objects.count() == 13  # 2 reviews, 10 comments, 1 check


def test_an_issue_labelled_for_intake_becomes_a_task_a_run_and_a_pr_that_closes_it(
    tmp_path: Path,
) -> None:
    up = _install(
        tmp_path, {"worker": {"write": "fix.txt"}, "verifier": {"output": APPROVE}}
    )
    project, forge_url, env = up.project, up.forge_url, up.env
    try:
        manage(env, "repo", "add", "acme/widgets", "--project-path", str(project))
        manage(
            env,
            "schedule_drain",
            "issues",
            "todos-task",
            "--every",
            "60m",
            "--deliver",
            "pull-request",
            "--github-repo",
            "acme/widgets",
        )
        sent = _control(
            forge_url,
            "issue",
            {
                "action": "opened",
                "repo": "acme/widgets",
                "number": 7,
                "title": "The widget leaks",
                "body": "It leaks when @someone resizes it.",
                "labels": ["auto:route", "bug"],
            },
        )
        assert sent["delivery"]["status"] == 200, sent
        assert sent["delivery"]["body"] and "queued" in sent["delivery"]["body"]

        def opened() -> list[dict[str, Any]] | None:
            pulls = [
                r
                for r in up.forge_requests()
                if r["method"] == "POST" and r["path"].endswith("/pulls")
            ]
            return pulls or None

        [pull] = wait_until(opened, timeout=180, what="the issue's pull request")
    finally:
        up.stop()
    output = up.log.read_text(errors="replace")
    assert "Traceback" not in output, output[-3000:]
    assert "Closes #7" in pull["body"]["body"]
    [item] = WorkflowWorkItem.objects.all()
    assert item.idempotency_key.endswith("acme/widgets#7")
    assert item.status == WorkItemStatus.SUCCEEDED
