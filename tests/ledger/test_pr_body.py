"""runs.pr_body: the pull request's title and body from ledger rows (no process, no forge;
tests/ledger/test_delivery.py and tests/test_delivery_process.py send them to the GitHub
stand-in)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from domain.forge_text import ZWJ, neutralize
from ledger.held_secrets import held_secrets_forget
from ledger.models import RunStatus, WorkflowStepAttempt, WorkflowStepRun
from runs.pr_body import (
    cost_text,
    inline,
    pull_request_body,
    pull_request_title,
)
from tests.agent_lines import claude_stream
from tests.factories import make_invocation, make_run, make_step_run, make_work_item

HOSTILE_TITLE = (
    "Fix #12 for @octocat, GH-7 and acme/app#3 ![x](https://evil.example/x.png) "
    "<img src=x onerror=alert(1)> **bold** | cell"
)


def test_mentions_references_and_closing_keywords_are_made_inert() -> None:
    said = neutralize(
        "Closes #12, fixes acme/app#3, ping @octocat and @acme/team; GH-7. "
        "Resolves: https://github.com/acme/app/issues/4 mail me@example.com #tag"
    )
    assert f"#{ZWJ}12" in said and f"acme/app#{ZWJ}3" in said
    assert f"@{ZWJ}octocat" in said and f"@{ZWJ}acme/team" in said
    assert f"GH{ZWJ}-7" in said
    assert f"R{ZWJ}esolves: https://github.com" in said
    # What acts on nothing stays as it was: an e-mail address, a tag word, prose.
    assert "me@example.com" in said and " #tag" in said and "ping" in said
    assert said.replace(ZWJ, "") == (
        "Closes #12, fixes acme/app#3, ping @octocat and @acme/team; GH-7. "
        "Resolves: https://github.com/acme/app/issues/4 mail me@example.com #tag"
    )


def test_inline_text_renders_as_itself_on_one_line() -> None:
    line = inline("![x](https://evil.example/x.png) <b>hi</b> *a* | b\n`c` #9 & ~d~")
    assert "\n" not in line
    assert line.startswith(r"!\[x\](https://evil.example/x.png) \<b\>hi\</b\>")
    assert r"\*a\* \| b \`c\` \#" + ZWJ + "9 \\& \\~d\\~" in line
    assert inline(None) == "" and len(inline("x" * 500, 50)) == 50


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        (0.19858499999999998, "$0.20"),
        (0.004, "<$0.01"),
        (0.005, "$0.01"),
        (0.0, "$0.00"),
        (12.3456, "$12.35"),
        (None, ""),
    ],
)
def test_costs_read_to_the_cent(usd: float | None, text: str) -> None:
    assert cost_text(usd) == text


CLAUDE_VERIFIER = claude_stream(
    "All checks pass.\nThe README names @octocat; closes #5.", cost=0.0031
)


def _run_with_a_moved_worker(**verifier: Any) -> Any:
    invocation = make_invocation(
        subject_json={
            "kind": "task",
            "id": "TASK-`9`",
            "raw": {"title": HOSTILE_TITLE, "description": "Fixes #2\n```\n@team"},
        }
    )
    item = make_work_item(invocation=invocation)
    run = make_run(status=RunStatus.SUCCEEDED, invocation=invocation, work_item=item)
    worker = make_step_run(
        workflow_run=run,
        step_id="worker",
        sequence=0,
        status="succeeded",
        account_profile="acct-b",
        account_tool="claude",
        commit_sha="0123456789abcdef0123",
    )
    start = timezone.now() - timedelta(minutes=5)
    for n, (account, status, cost) in enumerate(
        [
            ("acct-a", "rate_limited", 0.0001),
            ("acct-b", "succeeded", 0.19858499999999998),
        ]
    ):
        WorkflowStepAttempt.objects.create(
            step_run=worker,
            workflow_run=run,
            step_id="worker",
            account_profile=account,
            account_tool="claude",
            status=status,
            started_at=start + timedelta(seconds=n),
            finished_at=start + timedelta(seconds=n + 1),
            duration_ms=600 + n * 800,
            usage_input_tokens=1200 * (n + 1),
            usage_output_tokens=34,
            usage_cost_usd=cost,
        )
    make_step_run(
        workflow_run=run,
        step_id="verifier",
        sequence=1,
        status=verifier.pop("status", "succeeded"),
        account_profile="acct-a",
        account_tool="claude",
        **verifier,
    )
    return run


@pytest.mark.django_db
def test_the_body_tells_every_attempt_the_verifiers_own_words_and_no_markup(
    settings: Any,
) -> None:
    settings.LOOPSWEB_BASE_URL = "https://loops.example"
    run = _run_with_a_moved_worker(stdout=CLAUDE_VERIFIER)
    body = pull_request_body(run)
    lines = body.splitlines()
    # The heading is the title, escaped and inert: no image, tag, mention or reference.
    heading = lines[0]
    assert heading.startswith("## Fix \\#" + ZWJ + "12 for @" + ZWJ + "octocat")
    assert "!\\[x\\](https://evil.example/x.png)" in heading
    assert "\\<img src=x onerror=alert(1)\\>" in heading and "\\| cell" in heading
    assert "<img" not in body.replace("\\<img", "")
    assert "Task `` TASK-`9` ``," in body  # the id as a code span, whatever it holds
    # One row per attempt: the rate-limited account, then the one the step moved to.
    rows = [line for line in lines if line.startswith("| worker |")]
    assert rows == [
        "| worker | acct-a | claude | rate limited | 0.6 s | 1,200 in / 34 out, <$0.01 | - |",
        "| worker | acct-b | claude | succeeded | 1.4 s | 2,400 in / 34 out, $0.20 "
        "| `0123456789ab` |",
    ]
    assert "| verifier | acct-a | claude | succeeded |" in body
    # The verifier's own final words (claude's result), fenced and inert; not a summary.
    said = body.split("The verifier's last message:")[1]
    assert (
        "All checks pass.\nThe README names @" + ZWJ + "octocat; closes #" + ZWJ + "5."
    ) in said
    assert said.lstrip().startswith("```text\nAll checks pass.")
    assert "Checking." not in said and "done:" not in said and "cost $" not in said
    # The description is fenced with a fence longer than the backticks inside it.
    assert "````text\nFixes #" + ZWJ + "2\n```\n@" + ZWJ + "team\n````" in body
    assert f"Work item: https://loops.example/ops/items/{run.work_item_id}/" in body
    title = pull_request_title(run)
    assert "\n" not in title and len(title) <= 256
    assert title.startswith("Fix #" + ZWJ + "12 for @" + ZWJ + "octocat, GH" + ZWJ)
    assert "![x](https://evil.example/x.png)" in title  # plain text: nothing escaped


@pytest.mark.django_db
def test_a_verifier_that_said_nothing_shows_its_error_and_old_steps_their_own_row() -> (
    None
):
    run = _run_with_a_moved_worker(
        status="failed", stdout="", error="Not logged in (exit code 1)"
    )
    WorkflowStepAttempt.objects.filter(workflow_run=run).delete()
    WorkflowStepRun.objects.filter(workflow_run=run, step_id="worker").update(
        usage_input_tokens=10, usage_output_tokens=2, usage_cost_usd=0.5
    )
    body = pull_request_body(run)
    assert "The verifier's last message" not in body
    assert "The verifier's error:\n\n```text\nNot logged in (exit code 1)\n```" in body
    # A step recorded before attempts were: its own row.
    assert "| worker | acct-b | claude | succeeded | - | 10 in / 2 out, $0.50 |" in body


@pytest.mark.django_db
def test_a_held_secret_in_the_task_or_the_message_is_redacted_before_it_is_escaped(
    settings: Any,
) -> None:
    secret = "k3y_with_#123_and_@mention_*stars*"
    settings.SECRET_KEY = secret
    held_secrets_forget()
    try:
        run = _run_with_a_moved_worker(
            stdout=claude_stream(f"I saw {secret} in the env.", cost=0.01)
        )
        invocation = run.invocation
        invocation.subject_json["raw"]["title"] = f"Rotate {secret}"
        invocation.subject_json["raw"]["description"] = f"old: {secret}"
        invocation.save()
        body, title = pull_request_body(run), pull_request_title(run)
    finally:
        held_secrets_forget()
    for text in (body, title):
        # Not as it is, nor split by an escape or a joiner.
        plain = text.replace(ZWJ, "").replace("\\", "")
        assert "k3y_with" not in plain and "mention_" not in plain, text
    assert title == "Rotate [redacted:SECRET_KEY]"
    # The heading (escaped, as it renders), the description and the verifier's message.
    assert body.replace("\\", "").count("[redacted:SECRET_KEY]") == 3
