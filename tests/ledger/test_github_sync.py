"""The webhook's polling fallback (routing/github_sync.py; docs/revisions.md, "The sync"):
the open pull requests loopsweb opened, read with conditional requests from the GitHub
stand-in on 127.0.0.1, their reviews, comments and failing checks turned into revision
requests once each; an idle pass costs nothing but 304s."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from ledger.models import RevisionState, WorkflowRun, WorkItemRevision
from routing.github_sync import github_sync
from routing.models import GithubEtag
from tests.forge_standin import Forge
from tests.ledger.delivery_helpers import project_with_origin, run_task
from tests.ledger.runner_helpers import FakeAgent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture
def delivered(
    agent: FakeAgent, forge: Forge, tmp_path: Path, settings: Any
) -> WorkflowRun:
    """A run whose pull request #1 is open on the stand-in, its head the pushed commit."""
    settings.LOOPSWEB_REVISION_DEBOUNCE_SECONDS = 0
    agent.configure(steps={"worker": {"write": "note.txt"}})
    project, _ = project_with_origin(tmp_path)
    run = run_task(project, deliver="pull-request", github_repo="acme/widgets")
    assert run.delivery_json["pr"]["number"] == 1
    forge.set_head(1, run.commit_head)
    return run


def test_reviews_comments_and_failing_checks_become_one_revision_each_counted_once(
    delivered: WorkflowRun, forge: Forge
) -> None:
    forge.add_review(1, "CHANGES_REQUESTED", "rename x", delivered.commit_head)
    forge.add_review(1, "APPROVED", "fine by me", delivered.commit_head)
    forge.add_review_comment(1, "typo here", "note.txt", 1, delivered.commit_head)
    forge.add_check_run(1, "ci / unit", "failure", "2 failed", "https://ci.example/9")
    forge.add_check_run(1, "ci / lint", "success")
    report = github_sync()
    assert report.errors == [] and report.pulls == 1
    assert (report.reads, report.not_modified, report.findings) == (4, 0, 3)
    [revision] = WorkItemRevision.objects.all()
    keys = [s["key"] for s in revision.details["sources"]]
    assert [k.split(":")[0] for k in keys] == ["review", "comment", "check_run"]
    assert "rename x" in revision.findings and "ci / unit" in revision.findings
    assert (
        "fine by me" not in revision.findings and "ci / lint" not in revision.findings
    )
    assert GithubEtag.objects.count() == 4

    # Idle: every read answers 304 (no rate limit), nothing is counted again.
    before = len(forge.requests)
    again = github_sync()
    assert (again.reads, again.not_modified, again.findings) == (4, 4, 0)
    conditional = forge.requests[before:]
    assert all(r["if_none_match"] and r["status"] == 304 for r in conditional)
    assert len(WorkItemRevision.objects.get().details["sources"]) == 3

    # A new comment changes its list (the reviews and the checks answer 304): both
    # comments are read, the new one alone is counted.
    forge.add_review_comment(1, "and here", "note.txt", 2, delivered.commit_head)
    third = github_sync()
    assert (third.reads, third.findings) == (4, 2) and third.not_modified >= 2
    assert len(WorkItemRevision.objects.get().details["sources"]) == 4


def test_a_merged_pull_request_skips_its_waiting_revision_and_leaves_the_sync(
    delivered: WorkflowRun, forge: Forge
) -> None:
    forge.add_review(1, "CHANGES_REQUESTED", "rename x", delivered.commit_head)
    github_sync()
    forge.set_state(1, "closed", merged=True)
    report = github_sync()
    assert any("merged" in line for line in report.outcomes), report.outcomes
    revision = WorkItemRevision.objects.get()
    assert revision.state == RevisionState.SKIPPED
    assert "merged" in (revision.reason or "")
    delivered.refresh_from_db()
    assert delivered.delivery_json["pr"]["state"] == "merged"
    assert github_sync().pulls == 0


def test_a_dry_run_reads_and_writes_nothing_and_the_command_prints_json(
    delivered: WorkflowRun, forge: Forge
) -> None:
    forge.add_review(1, "CHANGES_REQUESTED", "rename x", delivered.commit_head)
    out = io.StringIO()
    call_command("github_sync", "--dry-run", "--json", stdout=out)
    answer = json.loads(out.getvalue())
    assert answer["dryRun"] is True and answer["findings"] == 1
    assert answer["outcomes"] == [
        f"acme/widgets#1: would count review:{answer_key(forge)}"
    ]
    assert not WorkItemRevision.objects.exists() and not GithubEtag.objects.exists()
    out = io.StringIO()
    call_command("github_sync", stdout=out)
    assert "1 open pull request(s): 4 read(s), 0 unchanged (304), counted 1" in (
        out.getvalue()
    )
    assert WorkItemRevision.objects.count() == 1


def answer_key(forge: Forge) -> Any:
    [review] = [r for reviews in forge.reviews.values() for r in reviews]
    return review["id"]


def test_a_forge_that_refuses_is_reported_and_read_again(
    delivered: WorkflowRun, forge: Forge
) -> None:
    forge.fail_next(502, {"message": "Server Error"})
    report = github_sync()
    assert report.errors and "502" in report.errors[0]
    assert not GithubEtag.objects.exists()
    assert github_sync().errors == []
