"""The record's side of revisions (ledger/services/revisions.py; issue 60): which run a round
binds, what it continues, requests that join, and a verdict read from a plain-text CLI's
whole output. Rows from the factories, no agent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from domain.github_findings import author_refusal
from domain.revisions import parse_verdict
from ledger.models import RevisionState, RunStatus, WorkItemRevision
from ledger.services.revisions import (
    revision_bind_run,
    revision_request,
    revision_started,
)
from tests.factories import make_run, make_work_item

pytestmark = pytest.mark.django_db


def _round(item_id: str, *, run_id: str | None, base: str | None) -> WorkItemRevision:
    revision = revision_request(
        item_id=item_id,
        trigger="review",
        findings="fix it",
        source={"key": f"review:{item_id}"},
        base_run_id=base,
        due_at=timezone.now(),
    )
    assert revision is not None
    revision_started(revision, round=1, run_id=run_id)
    return WorkItemRevision.objects.get(pk=revision.pk)


def test_a_run_after_the_rounds_failed_run_carries_the_round_on() -> None:
    item = make_work_item()
    failed = make_run(work_item=item, status=RunStatus.FAILED)
    revision = _round(item.id, run_id=failed.id, base=None)
    retry = make_run(work_item=item, status=RunStatus.QUEUED)
    bound = revision_bind_run(item.id, retry.id)
    assert bound is not None and bound.pk == revision.pk and bound.run_id == retry.id
    # Bound once: the same run finds it again; an older run never takes it.
    assert revision_bind_run(item.id, retry.id).pk == revision.pk
    assert revision_bind_run(item.id, failed.id) is None


def test_a_run_after_the_rounds_run_succeeded_is_no_revision() -> None:
    item = make_work_item()
    done = make_run(work_item=item, status=RunStatus.SUCCEEDED)
    _round(item.id, run_id=done.id, base=None)
    later = make_run(work_item=item, status=RunStatus.QUEUED)
    assert revision_bind_run(item.id, later.id) is None


def test_a_round_continues_the_newest_delivered_work() -> None:
    item = make_work_item()
    first = make_run(
        work_item=item,
        status=RunStatus.SUCCEEDED,
        delivery_json={"state": "delivered", "pr": {"repo": "a/b", "number": 1}},
    )
    # A request made while a later round ran names the run before it; that round then
    # delivered newer work, which the next round must continue.
    newer = make_run(
        work_item=item,
        status=RunStatus.SUCCEEDED,
        delivery_json={"state": "delivered", "pr": {"repo": "a/b", "number": 1}},
    )
    revision = _round(item.id, run_id=None, base=first.id)
    assert revision.base_run_id == newer.id


def test_requests_join_one_waiting_revision_and_a_source_counts_once() -> None:
    item = make_work_item()
    due = timezone.now()
    one = revision_request(
        item_id=item.id,
        trigger="review",
        findings="a",
        source={"key": "comment:1"},
        base_run_id=None,
        due_at=due,
    )
    two = revision_request(
        item_id=item.id,
        trigger="check",
        findings="b",
        source={"key": "check_run:2"},
        base_run_id=None,
        due_at=due + timedelta(seconds=30),
    )
    again = revision_request(
        item_id=item.id,
        trigger="review",
        findings="a",
        source={"key": "comment:1"},
        base_run_id=None,
        due_at=due,
    )
    assert one is not None and two is not None and one.pk == two.pk and again is None
    waiting = WorkItemRevision.objects.get(state=RevisionState.WAITING)
    assert waiting.due_at == due + timedelta(seconds=30)
    assert waiting.findings == "a\n\n---\n\nb"


@pytest.mark.parametrize(
    ("item", "refused"),
    [
        (
            {"user": {"login": "m", "type": "User"}, "author_association": "MEMBER"},
            False,
        ),
        ({"user": {"login": "x", "type": "User"}, "author_association": "NONE"}, True),
        ({"user": {"login": "y", "type": "User"}}, True),
        ({"user": {"login": "b", "type": "Bot"}, "author_association": "OWNER"}, True),
        (
            {
                "user": {"login": "c", "type": "User"},
                "author_association": "contributor",
            },
            True,
        ),
    ],
)
def test_only_a_trusted_author_may_send_the_work_back(
    item: dict[str, object], refused: bool
) -> None:
    trusted = ("OWNER", "MEMBER", "COLLABORATOR")
    assert (author_refusal(item, trusted) is not None) is refused


def test_a_plain_text_verifier_keeps_its_findings_after_a_blank_line() -> None:
    # What a plain-text CLI printed: the verdict line, a blank line, its findings.
    said = "Checked the change.\n\nVERDICT: changes\n\n- a.py:3 is wrong\n- add a test"
    verdict = parse_verdict(said)
    assert verdict.verdict == "changes"
    assert verdict.text == "- a.py:3 is wrong\n- add a test"
