"""From task to pull request through the real processes (issue 40): `make run`
(scripts/run.sh: runserver and both clusters) with the fake agent, the GitHub stand-in as a
process of its own (tests/forge_standin.py), a bare repository on local disk as the
project's `origin`; a second terminal routes a todos task with `--deliver pull-request`.
The fake agent stands in for claude over a pool of two accounts: the worker's first
account answers 429, so the step moves to the other, and the verifier prints claude's
stream-json with its own last words and a cost. The test watches the ledger and the
stand-in's record: the agent's file on `loopsweb/run-<id>` in the remote, one commit per
step that changed files with its trailers, a pull request whose title and body carry the
task's mentions and references inert, a row for each account of the moved step, the
verifier's own message and its cost to the cent, and the PR link and the patch on the item
page."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from domain.forge_text import ZWJ
from domain.pool import render_time_profile
from tests.agent_lines import claude_stream
from tests.ledger.runner_helpers import git, git_project
from tests.processes import (
    ROOT,
    free_port,
    make_run_env,
    manage,
    staff_login,
    start_make_run,
    stop_make_run,
    stop_process_group,
    wait_for_http,
)
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.sqlite,
    pytest.mark.slow,
    pytest.mark.xdist_group("installation"),
]

TOKEN = "ghp_process_standin_token_42"
POOL = ["acct-a", "acct-b", "acct-c"]
# The worker's and the verifier's accounts at admission (all idle: the pool's pick by the
# task id); the worker's 429 moves it to the third (worker ≠ verifier: never the
# verifier's).
FIRST = render_time_profile(POOL, "TASK-7", "worker")
VERIFIER = render_time_profile(POOL, "TASK-7", "verifier")
OTHER = next(account for account in POOL if account not in (FIRST, VERIFIER))
VERIFIER_SAID = "VERIFIED: README.md is there.\nThanks @octocat, this closes #12."
# claude's stream-json as the verifier prints it: its own words in `result`, and a cost.
VERIFIER_OUTPUT = claude_stream(
    VERIFIER_SAID,
    cost=0.19858499999999998,
    earlier="Hm.",
    usage={"input_tokens": 39009, "output_tokens": 53},
)


def _forge(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    record = tmp_path / "forge-requests.jsonl"
    log = tmp_path / "forge.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forge_standin", str(record)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = wait_for(
        lambda: log.read_text().split("\n", 1)[0] if "\n" in log.read_text() else None,
        what="the forge stand-in's URL",
    )
    return proc, url, record


def test_a_todos_task_routed_with_deliver_pull_request_ends_in_a_pr_on_the_forge(
    tmp_path: Path,
) -> None:
    data = tmp_path / "var"
    project = git_project(data / "projects" / "app")
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(project, "remote", "add", "origin", str(origin))
    git(project, "push", "-q", "origin", "main")
    token_file = tmp_path / "github.env"
    token_file.write_text(f"GITHUB_TOKEN={TOKEN}\n")
    token_file.chmod(0o600)
    agent_config = tmp_path / "agent.json"
    agent_config.write_text(
        json.dumps(
            {
                "profiles": {FIRST: {"rate_limit": "HTTP 429 Too Many Requests"}},
                "steps": {
                    "worker": {"write": "README.md"},
                    "verifier": {"output": VERIFIER_OUTPUT},
                },
            }
        )
    )
    forge, forge_url, record = _forge(tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = make_run_env(
        data,
        port,
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="FAKE_AGENT_*",
        LOOPSWEB_CLAUDE_BIN=str(ROOT / "scripts" / "fake-agent"),
        FAKE_AGENT_CONFIG=str(agent_config),
        LOOPSWEB_GITHUB_API_URL=forge_url,
        LOOPSWEB_GITHUB_TOKEN_FILE=str(token_file),
        LOOPSWEB_BASE_URL=base,
    )
    server = start_make_run(env, tmp_path / "make-run.log")
    try:
        wait_for_http(f"{base}/admin/login/")
        # A pool routes (and a rate-limited step moves) over registered accounts.
        for account in POOL:
            home = tmp_path / "logins" / account
            home.mkdir(parents=True)
            manage(
                env,
                "account",
                "add",
                account,
                "--provider",
                "claude",
                "--claude-config-dir",
                str(home),
            )
        event = {
            "id": "evt-pr-1",
            "type": "task.created",
            "source": "@hasna/todos",
            "data": {
                "id": "TASK-7",
                "title": "Add a README for @octocat (fixes #12)",
                "description": "Write README.md for the app.",
                "tags": ["auto:route"],
                "project_path": str(project),
            },
        }
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "route_event",
                "todos-task",
                "--event-json",
                json.dumps(event),
                "--provider",
                "claude",
                "--auth-profile-pool",
                ",".join(POOL),
                "--deliver",
                "pull-request",
                "--github-repo",
                "acme/app",
                "--json",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        run_id = json.loads(done.stdout)["run"]["id"]
        database = sqlite3.connect(data / "loopsweb.sqlite3", timeout=20)

        def delivered() -> dict[str, object] | None:
            row = database.execute(
                "SELECT status, delivery_json, work_item_id FROM workflow_runs WHERE id = ?",
                (run_id,),
            ).fetchone()
            if row is None or row[1] is None:
                return None
            delivery = json.loads(row[1])
            if delivery.get("state") not in ("delivered", "failed", "skipped"):
                return None
            return {"status": row[0], "delivery": delivery, "item": row[2]}

        try:
            found = wait_for(delivered, timeout=240, interval=0.5, what=f"run {run_id}")
        except AssertionError:
            raise AssertionError(
                (tmp_path / "make-run.log").read_text()[-4000:]
            ) from None
        assert found["status"] == "succeeded", found
        delivery = found["delivery"]
        assert delivery["state"] == "delivered", delivery
        branch = f"loopsweb/run-{run_id}"
        # The agent's file is on the run's branch in the bare remote.
        assert git(origin, "rev-parse", branch).strip() == delivery["commit"]
        assert git(origin, "show", f"{branch}:README.md") == run_id
        # One commit per step that changed files (the worker), its trailers naming it.
        log = git(origin, "log", "--format=%B%x1e", f"main..{branch}").split("\x1e")
        commits = [c for c in log if c.strip()]
        assert len(commits) == 1
        assert "(task TASK-7): step worker" in commits[0]
        assert "Loopsweb-Step: worker" in commits[0]
        assert f"Loopsweb-Account: {OTHER}" in commits[0]
        # The forge got one pull request, with the token, whose body names the task and
        # every step's account.
        requests = [json.loads(line) for line in record.read_text().splitlines()]
        [pull] = [r for r in requests if r["method"] == "POST"]
        assert pull["path"] == "/repos/acme/app/pulls"
        assert pull["authorization"] == f"Bearer {TOKEN}"
        assert pull["body"]["head"] == branch and pull["body"]["base"] == "main"
        # The title is plain text, its mention and reference inert.
        inert = f"Add a README for @{ZWJ}octocat (fixes #{ZWJ}12)"
        assert pull["body"]["title"] == inert
        body = pull["body"]["body"]
        assert "## " + inert.replace("#", "\\#") + "\n" in body
        assert "Write README.md for the app." in body
        # A row for each account the worker ran on; the verifier's own words and cost.
        assert f"| worker | {FIRST} | claude | rate limited |" in body
        assert f"| worker | {OTHER} | claude | succeeded |" in body
        assert "| verifier |" in body and "39,009 in / 53 out, $0.20 |" in body
        said = VERIFIER_SAID.replace("@", "@" + ZWJ).replace("#", "#" + ZWJ)
        assert f"The verifier's last message:\n\n```text\n{said}\n```" in body
        steps = database.execute(
            "SELECT step_id, account_profile FROM workflow_step_runs "
            "WHERE workflow_run_id = ? ORDER BY sequence",
            (run_id,),
        ).fetchall()
        database.close()
        assert len(steps) == 2
        for step_id, account in steps:
            assert f"| {step_id} | {account} |" in body
        assert f"{base}/ops/items/{found['item']}/" in body
        pr_url = delivery["pr"]["url"]
        # The item page (a staff session on the real server) and the API show it.
        opener, _ = staff_login(base, "/ops/")
        page = opener.open(f"{base}/ops/items/{found['item']}/").read().decode()
        assert f'href="{pr_url}"' in page
        assert "+++ b/README.md" in page and f"+{run_id}" in page
        api = json.loads(
            opener.open(f"{base}/api/v1/work-items/{found['item']}").read()
        )
        assert api["runs"][0]["pullRequest"]["url"] == pr_url
        assert TOKEN not in page + json.dumps(api)
    finally:
        stop_make_run(server)
        stop_process_group(forge)
