"""The PR review gate (docs/upstream.md §3.2.11): a todos
task that references a PR and shows review or merge intent, its PR looked up on the GitHub
stand-in (tests/forge_standin.py) or read from the task's `pr_state=`; merged / closed / open
/ a moved head; a reviewer who is not the PR's author; the drain's freshnessClosed count.
The domain's table tests: tests/domain/test_review.py."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from ledger.models import WorkflowInvocation, WorkflowWorkItem
from routing.admission.review_gate import forget_pr_states
from routing.drains.inbox import inbox_ingest
from routing.models import DrainRecord
from tests.forge_standin import Forge, start_forge
from tests.routing.helpers import route, todos_event

pytestmark = pytest.mark.django_db

PR = "https://github.com/acme/widgets/pull/1"
HEAD = "a" * 40


@pytest.fixture
def forge(settings: Any, tmp_path: Path) -> Iterator[Forge]:
    standin, server = start_forge()
    token = tmp_path / "github.env"
    token.write_text("GITHUB_TOKEN=ghp_gate_token\n")
    token.chmod(0o600)
    settings.LOOPSWEB_GITHUB_API_URL = standin.url
    settings.LOOPSWEB_GITHUB_TOKEN_FILE = str(token)
    # PR #1 of acme/widgets, head HEAD.
    standin.pulls[1] = {
        "number": 1,
        "html_url": PR,
        "state": "open",
        "merged": False,
        "draft": False,
        "head": {"ref": "feature", "sha": HEAD},
        "base": {"ref": "main"},
        "user": {"login": "mona"},
    }
    forget_pr_states()
    try:
        yield standin
    finally:
        forget_pr_states()
        server.shutdown()
        server.server_close()


def _review(task_id: str, **data: Any) -> dict[str, Any]:
    event = todos_event(task_id, title=f"Review {PR}", description="merge it", **data)
    return route("todos-task", event, github_reviewer="hubot").to_dict()


@pytest.mark.parametrize(
    ("state", "merged", "shown"),
    [("closed", True, "MERGED"), ("closed", False, "CLOSED")],
)
def test_a_review_of_a_merged_or_closed_pr_is_skipped_as_a_freshness_skip(
    forge: Forge, state: str, merged: bool, shown: str
) -> None:
    forge.set_state(1, state, merged=merged)
    result = _review("rv-1")
    assert result["kind"] == "skipped" and result["skipped"] is True
    assert result["freshnessSkip"] is True and result["prState"] == shown
    assert result["routeError"] is True
    assert result["prReviewRouting"]["pr"] == "acme/widgets#1"
    assert result["prReviewRouting"]["source"] == "forge"
    assert WorkflowWorkItem.objects.count() == WorkflowInvocation.objects.count() == 0
    [request] = forge.requests
    assert (request["method"], request["path"]) == (
        "GET",
        "/repos/acme/widgets/pulls/1",
    )
    # Cached: a second look within the cache time asks the forge nothing.
    _review("rv-1b")
    assert len(forge.requests) == 1


def test_an_open_pr_is_admitted_and_a_moved_head_is_reviewed_again(
    forge: Forge,
) -> None:
    first = _review("rv-2", head_sha=HEAD)
    assert first["kind"] == "created"
    key = first["idempotencyKey"]
    assert key == "todos-task:pr:acme/widgets#1"
    forget_pr_states()
    forge.pulls[1]["head"]["sha"] = "b" * 40
    again = _review("rv-2", head_sha=HEAD)  # the task was made for the old head
    assert again["kind"] == "created" and again["idempotencyKey"] == f"{key}@{'b' * 12}"
    assert WorkflowWorkItem.objects.count() == 2


def test_an_admitted_review_carries_its_pr_review_routing_a_plain_task_none(
    forge: Forge, admin_client: Client
) -> None:
    review = _review("rv-7", head_sha=HEAD)
    plain = route("todos-task", todos_event("rv-8")).to_dict()
    assert review["kind"] == plain["kind"] == "created"
    expected = {
        "required": True,
        "allowed": True,
        "author": "mona",  # the forge's: the task names none
        "authorSource": "forge",
        "reviewers": ["hubot"],
        "selectedReviewer": "hubot",
        "signals": ["pr-approval-intent", "author-derived-forge"],
        "pr": "acme/widgets#1",
        "repo": "acme/widgets",
        "number": 1,
        "head": HEAD,
        "prState": "OPEN",
        "source": "forge",
    }
    assert review["prReviewRouting"] == expected
    assert "prReviewRouting" not in plain
    for result, shown in ((review, expected), (plain, None)):
        item = WorkflowWorkItem.objects.get(pk=result["workItem"]["id"])
        assert item.invocation.scope_json.get("prReviewRouting") == shown
        api = admin_client.get(f"/api/v1/work-items/{item.id}")
        assert api.status_code == 200 and api.json()["prReviewRouting"] == shown
    # A second route of the task (deduped) says so too.
    again = _review("rv-7", head_sha=HEAD)
    assert again["kind"] == "deduped" and again["prReviewRouting"] == expected


def test_without_a_forge_the_tasks_pr_state_decides_as_upstream_reads_it(
    settings: Any,
) -> None:
    settings.LOOPSWEB_GITHUB_TOKEN_FILE = None
    forget_pr_states()
    event = todos_event("rv-3", title=f"Approve {PR}", description="pr_state=MERGED")
    result = route("todos-task", event).to_dict()
    assert result["kind"] == "skipped" and result["freshnessSkip"] is True
    assert result["prState"] == "MERGED"
    assert result["reason"] == (
        "PR is already merged; skipping merge/review route (freshness gate)"
    )
    assert result["prReviewRouting"]["source"] == "task"
    assert result["prReviewRouting"]["signals"][-1] == "pr-not-open"
    # No review or merge intent: not a review task, routed as before (the fingerprint
    # dedupe only).
    plain = route(
        "todos-task", todos_event("rv-4", title=f"Look at {PR} pr_state=MERGED")
    )
    assert plain.to_dict()["kind"] == "created"


def test_the_drain_counts_freshness_skips_as_freshness_closed(
    forge: Forge, admin_client: Client
) -> None:
    forge.set_state(1, "closed", merged=True)
    events = [
        todos_event("rv-5", title=f"Review {PR}", description="merge it"),
        todos_event("rv-6"),
    ]
    inbox_ingest(enumerate(events, start=1))
    out = io.StringIO()
    call_command("drain", "todos-task", "--max-dispatch", "5", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["freshnessClosed"] == 1 and report["created"] == 1
    [skip] = [r for r in report["results"] if r.get("freshnessSkip")]
    assert skip["prState"] == "MERGED"
    # The drain's record keeps the count, and the API shows it.
    record = DrainRecord.objects.get(pk=report["drainId"])
    assert (record.freshness_closed, record.skipped, record.created) == (1, 1, 1)
    api = admin_client.get(f"/api/v1/drains/{record.id}")
    assert api.status_code == 200 and api.json()["freshnessClosed"] == 1
    out = io.StringIO()
    call_command("drain", "todos-task", stdout=out)
    assert "freshnessClosed=0" in out.getvalue()
    assert DrainRecord.objects.latest("started_at").freshness_closed == 0
