"""A run's side of revisions (docs/revisions.md): the round a run carries out, and what its
verifier's verdict does when the run ends.

- **Where a round starts.** A run bound to a revision (ledger.services.revisions
  `revision_bind_run`) makes its worktree from the branch of the run it continues (only a
  branch loopsweb named, `loopsweb/run-<id>`), so the round's commits follow the earlier
  ones; its worker's prompt ends with the round, the budget and the findings, fenced as
  data (domain.revisions.revision_prompt).
- **The verdict decides delivery.** When a run that succeeded has a verifier whose verdict
  is `changes`, its work is not delivered: a revision of the item is requested (trigger
  `verdict`, the verifier's findings, due at once) and routing.revisions starts it;
  `escalate` sends the item to a human. Either way the delivery records `skipped` with why,
  and the pull request opens only on approve. No verdict line reads as approve.
- **A human is told once.** `needs_human` moves the item there and, when the item has a
  pull request, puts one comment and the label `needs-human` on it.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from agents.redaction import Redactor
from domain.errors import ApplicationError
from domain.forge_text import neutralize
from domain.revisions import (
    CHANGES,
    ESCALATE,
    Verdict,
    fenced,
    max_revisions,
    revision_prompt,
)
from ledger.held_secrets import held_secrets
from ledger.models import (
    RevisionState,
    RevisionTrigger,
    RunStatus,
    WorkflowRun,
    WorkItemRevision,
)
from ledger.services.revisions import (
    item_needs_human,
    item_pull_request,
    revision_bind_run,
    revision_request,
    revisions_due_queue,
    revisions_waiting,
)
from runs.github import ForgeError, add_labels, comment_on_issue
from runs.worktrees import worktree_branch

logger = logging.getLogger(__name__)

NEEDS_HUMAN_LABEL = "needs-human"
HELD_CHANGES = "the verifier asked for changes: a revision of the item was requested"
HELD_ESCALATE = "the verifier escalated to a human"
VERIFIER_ESCALATED = "the verifier escalated: {why}"


def run_revision(run: WorkflowRun) -> WorkItemRevision | None:
    """The revision `run` carries out (bound now if it is the item's newest started round
    without a run), or None."""
    if not run.work_item_id:
        return None
    return revision_bind_run(run.work_item_id, run.id)


def revision_start_branch(revision: WorkItemRevision | None) -> str | None:
    """The branch a round's worktree starts from: its base run's, when loopsweb named it."""
    if revision is None or not revision.base_run_id:
        return None
    branch = (
        WorkflowRun.objects.filter(pk=revision.base_run_id)
        .values_list("worktree_branch", flat=True)
        .first()
    )
    return branch if branch == worktree_branch(revision.base_run_id) else None


def revision_worker_prompt(run: WorkflowRun, revision: WorkItemRevision) -> str:
    """What the round's worker is told after the task (domain.revisions)."""
    item = run.work_item
    budget = max_revisions(item.route_option("max_revisions") if item else None)
    return revision_prompt(
        round=revision.round or 1,
        budget=budget,
        trigger=revision.trigger,
        findings=revision.findings,
    )


def verdict_after_run(
    run: WorkflowRun, status: str, said: tuple[str, Verdict] | None
) -> str | None:
    """What the ended run's verifier verdict does (module docstring, "the verdict decides
    delivery"): why its delivery is held, or None (deliver as the route says). `said`: the
    verifier step's id and its verdict, as its step ended in this execution (the verifier
    is the run's last step: the run ends right after it)."""
    if status != RunStatus.SUCCEEDED or not run.work_item_id or said is None:
        return None
    step_id, verdict = said
    if verdict.verdict == ESCALATE:
        why = verdict.text or "no reason given"
        needs_human(run.work_item_id, VERIFIER_ESCALATED.format(why=why[:500]))
        return HELD_ESCALATE
    if verdict.verdict != CHANGES:
        return None
    revision_request(
        item_id=run.work_item_id,
        trigger=RevisionTrigger.VERDICT,
        findings=verdict.text,
        source={"trigger": "verdict", "runId": run.id, "stepId": step_id},
        base_run_id=run.id,
        due_at=timezone.now(),
    )
    return HELD_CHANGES


def revisions_queue_waiting(run: WorkflowRun) -> None:
    """After a run of an item ends, its waiting revisions (one that came while the run was
    on, one just requested) are swept now rather than at the next minute."""
    try:
        if run.work_item_id and revisions_waiting(run.work_item_id):
            revisions_due_queue()
    except DatabaseError:
        logger.exception("run %s: could not read its item's revisions", run.id)


def needs_human(item_id: str, reason: str) -> bool:
    """The item goes to `needs_human` (ledger.services.revisions.item_needs_human); when
    that is new and it has a pull request, one comment and the `needs-human` label on it.
    A forge that refuses is logged: the item's status already says it."""
    # The reason may quote a verifier; no secret loopsweb holds leaves in it (the item's
    # row, the pull request's comment, the notification).
    reason = Redactor(held_secrets()).redact(reason)
    if not item_needs_human(item_id, reason):
        return False
    delivered = item_pull_request(item_id)
    if delivered is None:
        return True
    pr = delivered[1]["pr"]
    try:
        repo, number = str(pr["repo"]), int(pr["number"])
        comment_on_issue(repo, number, give_up_comment(item_id, reason))
        add_labels(repo, number, [NEEDS_HUMAN_LABEL])
    except (ForgeError, ApplicationError, KeyError, ValueError) as exc:
        logger.warning("item %s: the pull request was not told: %s", item_id, exc)
    return True


def give_up_comment(item_id: str, reason: str) -> str:
    """What the pull request is told when the loop gives up: what was tried, why it
    stopped (a verifier's words among it, fenced and neutralized: domain.forge_text), where
    to look."""
    rounds = WorkItemRevision.objects.filter(
        work_item_id=item_id, state=RevisionState.STARTED
    ).order_by("round")
    lines = [
        "loopsweb stopped revising this pull request. Why:",
        fenced(neutralize(reason)),
        "",
        "Rounds:",
    ]
    lines += [
        f"- round {r.round}: sent back by the {r.trigger}, run `{r.run_id or '-'}`"
        for r in rounds
    ] or ["- none ran"]
    base = settings.LOOPSWEB_BASE_URL
    where = f"{base}/ops/items/{item_id}/" if base else f"work item `{item_id}`"
    lines += ["", f"A human decides what comes next: {where}"]
    return "\n".join(lines)
