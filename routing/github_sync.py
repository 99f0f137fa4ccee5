"""The polling fallback of the webhook (docs/revisions.md, "The sync"): for an installation
GitHub cannot reach, `manage.py github_sync` (and the `github-sync` schedule, every five
minutes) reads the open pull requests loopsweb opened and turns what they say into revision
requests, as the webhook would (routing.github_hooks; the same findings,
domain.github_findings).

- **Which pull requests.** Each work item's newest delivered pull request, while its record
  says `open` and the item is neither cancelled nor waiting for a human; at most
  SYNC_LIMIT per pass, the most recently delivered first.
- **Four reads each, all conditional.** The pull request, its reviews, its review comments
  and the check runs of the commit loopsweb pushed last, each with `If-None-Match` and the
  ETag of the last answer (`routing_github_etags`): an unchanged one answers 304, which
  GitHub does not count against the rate limit, so an idle sync costs none.
- **Counted once.** Every finding carries its source's key (`review:<id>`, ...): a review
  the webhook or an earlier sync counted already is not counted again
  (ledger.services.revisions). A merged or closed pull request has its item's waiting
  revisions skipped.
- **Nothing half-done.** A forge that refuses or cannot be reached is reported for that pull
  request; the others go on, and the next pass reads it again (its ETag was not stored).
  `--dry-run` reads and reports, and writes nothing (no revision, no ETag).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction

from domain.errors import ApplicationError
from domain.github_findings import (
    Finding,
    author_refusal,
    check_run_finding,
    comment_finding,
    obj,
    review_finding,
)
from ledger.models import WorkflowRun, WorkItemStatus
from ledger.services.delivery import run_pull_request_state
from ledger.services.revisions import revisions_skip_waiting
from routing.models import GithubEtag
from routing.revisions import pull_request_revision
from runs.github import ForgeError, get_if_changed

SYNC_LIMIT = 200
# Items per list read (GitHub's largest page; its default is 30). A pull request with more
# reviews or comments than one page has the rest counted by the webhook only.
PAGE = 100
NO_TOKEN = "LOOPSWEB_GITHUB_TOKEN_FILE is not set: nothing to sync"


@dataclass
class SyncReport:
    pulls: int = 0
    reads: int = 0
    not_modified: int = 0
    findings: int = 0
    outcomes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "pulls": self.pulls,
            "reads": self.reads,
            "notModified": self.not_modified,
            "findings": self.findings,
            "outcomes": self.outcomes,
            "errors": self.errors,
            "dryRun": self.dry_run,
        }


def open_pull_requests(
    limit: int = SYNC_LIMIT,
) -> list[tuple[str, str, dict[str, Any]]]:
    """(item id, run id, delivery record) of each item's newest delivered pull request
    that is open (module docstring, "which pull requests")."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    rows = (
        WorkflowRun.objects.filter(
            delivery_json__state="delivered",
            delivery_json__pr__state="open",
            work_item_id__isnull=False,
        )
        .exclude(
            work_item__status__in=(
                WorkItemStatus.CANCELLED,
                WorkItemStatus.NEEDS_HUMAN,
            )
        )
        .order_by("-created_at")
        .values_list("work_item_id", "id", "delivery_json")
    )
    for item_id, run_id, record in rows.iterator():
        if item_id in found or not isinstance(record, dict):
            continue
        found[item_id] = (run_id, record)
        if len(found) >= limit:
            break
    return [(item_id, run_id, record) for item_id, (run_id, record) in found.items()]


def github_sync(*, dry_run: bool = False) -> SyncReport:
    """One pass (module docstring)."""
    report = SyncReport(dry_run=dry_run)
    if not settings.LOOPSWEB_GITHUB_TOKEN_FILE:
        report.errors.append(NO_TOKEN)
        return report
    for item_id, run_id, record in open_pull_requests():
        report.pulls += 1
        pr = record["pr"]
        try:
            _sync_one(report, item_id, run_id, record)
        except (ForgeError, ApplicationError, KeyError, ValueError) as exc:
            report.errors.append(f"{pr.get('repo')}#{pr.get('number')}: {exc}")
    return report


class _Reader:
    """Conditional reads for one pull request; the ETags stored once it is done."""

    def __init__(self, report: SyncReport) -> None:
        self.report = report
        self.etags: dict[str, str] = {}

    def read(self, path: str) -> Any | None:
        known = GithubEtag.objects.filter(path=path).values_list("etag", flat=True)
        answer = get_if_changed(path, known.first())
        self.report.reads += 1
        if answer.status == 304:
            self.report.not_modified += 1
            return None
        if answer.etag:
            self.etags[path] = answer.etag
        return answer.body

    def keep(self) -> None:
        for path, etag in self.etags.items():
            GithubEtag.objects.update_or_create(path=path, defaults={"etag": etag})


def _sync_one(
    report: SyncReport, item_id: str, run_id: str, record: dict[str, Any]
) -> None:
    """The four reads of one pull request and what they say; ETags kept only when every
    read went through and what they said was recorded."""
    repo, number = str(record["pr"]["repo"]), int(record["pr"]["number"])
    reader = _Reader(report)
    base = f"/repos/{repo}/pulls/{number}"
    pull = obj(reader.read(base))
    found: list[tuple[Finding, str | None]] = []
    closed = pull and (pull.get("state") != "open" or pull.get("merged"))
    if not closed:
        trusted = tuple(settings.LOOPSWEB_GITHUB_TRUSTED_ASSOCIATIONS)
        for review in reader.read(f"{base}/reviews?per_page={PAGE}") or []:
            if author_refusal(obj(review), trusted) is None:
                if (finding := review_finding(obj(review))) is not None:
                    found.append((finding, None))
        for comment in reader.read(f"{base}/comments?per_page={PAGE}") or []:
            if author_refusal(obj(comment), trusted) is None:
                found.append((comment_finding(obj(comment)), None))
        pushed = str(record.get("commit") or "")
        if pushed:
            checks = obj(
                reader.read(
                    f"/repos/{repo}/commits/{pushed}/check-runs?per_page={PAGE}"
                )
            )
            for check in checks.get("check_runs") or []:
                if (finding := check_run_finding(obj(check))) is not None:
                    found.append((finding, pushed))
    report.findings += len(found)
    if report.dry_run:
        report.outcomes += [
            f"{repo}#{number}: would count {f.source['key']}" for f, _ in found
        ]
        return
    with transaction.atomic():
        if closed:
            state = "merged" if pull.get("merged") else "closed"
            run_pull_request_state(WorkflowRun.objects.get(pk=run_id), state)
            skipped = revisions_skip_waiting(
                [item_id], f"skipped: the pull request #{number} was {state}"
            )
            report.outcomes.append(f"{repo}#{number} {state}: {skipped} skipped")
        for finding, commit in found:
            report.outcomes += pull_request_revision(
                repo,
                [number],
                finding,
                commit=commit,
                delay=float(settings.LOOPSWEB_REVISION_DEBOUNCE_SECONDS),
            )
        reader.keep()
