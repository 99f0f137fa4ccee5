"""GitHub issues come in as todos tasks (docs/github-intake.md).

The mapped repositories (`GithubRepo`, `manage.py repo`, the admin): `github_repo_clean` is
the one validation the command and the admin's form run (the name, the project path as a
route admits it, the label; one mapping per repository, names compared without case), and
`github_repo_save` / `github_repo_remove` the writes.

`issue_event(action, payload)` takes one `issues` webhook delivery (the webhook view checks
its signature and its delivery id first) and returns a one-line outcome, beginning with what
it did: `queued`, `updated`, `unchanged`, `withdrawn` or `ignored`. Its rules:
1. The payload's shape is checked first (domain.github_issues.issue_of): a bad one raises
   ValidationError and nothing is written.
2. `ignored`, nothing written: an action not taken, a pull request, a repository that is not
   mapped, a delivery older than what the inbox holds for the issue (its `updated_at`), and,
   for `opened`, `labeled`, `edited`, `reopened` and `unlabeled`, a closed issue or one
   without the intake label; `closed`, `deleted` and `unlabeled` of the intake label for an
   issue the inbox never took.
3. `opened`, `labeled`, `edited`, `reopened`, and `unlabeled` of another label, of an open
   issue with the intake label: its envelope (domain.github_issues.issue_envelope) goes
   through `inbox_ingest`, as one POSTed to the API would (the drains' wake-up included). The
   event id is the issue's, so a second delivery finds the row:
   - still open (pending or deferred, its work item none, queued or deferred): its data is
     replaced by the issue's as it is now (`updated`; `unchanged` when it is the same) and
     its attempt counter moves, so a drain that read the old text loses its claim on the row
     and the next drain routes the new one (a deferred work item takes the new text then);
   - withdrawn earlier (below): the row is pending again with the issue's data, the work
     item the withdrawal cancelled is requeued, and the drains are woken (`queued`);
   - admitted (the row, or its work item admitted, running or finished): nothing changes
     (`unchanged`, naming the item);
   - skipped or failed by a drain, or discarded by an operator: the row keeps its state
     and takes the issue's text (`updated`), which the admin's Retry then routes.
4. `closed`, `deleted`, and `unlabeled` of the intake label: the open row is withdrawn: it
   becomes `skipped` with the reason, marked as withdrawn (`metadata.github_withdrawn`, the
   action), and its queued or deferred work item is cancelled (ledger.services,
   `work_item_cancel`) (`withdrawn`). Admitted: nothing changes and the outcome says so,
   naming the item (`routes cancel` stops it).
5. An issue whose author is not trusted (`author_association` outside
   LOOPSWEB_GITHUB_TRUSTED_ASSOCIATIONS) is taken only by a `labeled` delivery naming the
   intake label (a maintainer applied it: anyone may open or edit an issue, and a template
   may label it), with its text then; its `edited` afterwards withdraws it as `closed`
   would, and the rest is `ignored` with the reason.
Rows are read and written under the admission lock, the row locked, in one transaction (as
an operator's retry or discard: routing.drains.inbox), so a drain's admission never meets a
half-done change.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from domain.controls import terminal_text
from domain.errors import ValidationError
from domain.events import parse_envelope
from domain.github_issues import (
    SOURCE,
    TASK_EVENT_TYPE,
    Issue,
    applied_label,
    checked_intake_label,
    checked_repo_name,
    issue_envelope,
    issue_of,
    older_than,
)
from ledger.hosts import hosts_snapshot
from ledger.lock import admission_lock
from ledger.models import WorkflowWorkItem, WorkItemStatus
from ledger.services import work_item_cancel, work_item_requeue
from routing.drains.inbox import IngestRejected, inbox_ingest
from routing.drains.wake import drains_wake_after_ingest
from routing.models import (
    DEFAULT_INTAKE_LABEL,
    OPEN_INBOX_STATES,
    GithubRepo,
    InboxEvent,
    InboxState,
)
from runs.projects import project_path_admit

# --- the mapped repositories -------------------------------------------------------------------

REPO_EXISTS = (
    "repository {name} is mapped already (to {path}): change that mapping instead "
    "(repo add --update, or its admin page)"
)
REPO_NOT_FOUND = "no repository {name} is mapped"


class RepoInvalid(ValidationError):
    """A mapping refused: `field` names the form field it is about."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RepoValues:
    full_name: str
    project_path: str  # the project as a route admits it (runs.projects)
    intake_label: str


def github_repo_find(full_name: str) -> GithubRepo | None:
    """The mapping of `full_name`, its case ignored (GitHub's names are case-insensitive)."""
    return GithubRepo.objects.filter(full_name__iexact=full_name.strip()).first()


def github_repo_clean(
    *,
    full_name: object,
    project_path: object,
    intake_label: object = None,
    exclude_pk: str | None = None,
) -> RepoValues:
    """The one check of a mapping (the command's and the admin's; RepoInvalid naming the
    field): an OWNER/NAME, a project path a route admits (inside LOOPSWEB_PROJECT_ROOTS or,
    with hosts registered, the hosts' roots: runs.projects.project_path_admit; the project
    it resolves to is what is kept), a label (domain.github_issues), and no other mapping of
    the same name (`exclude_pk`: the row being edited). Reads the file system, writes
    nothing."""
    try:
        name = checked_repo_name(full_name)
    except ValidationError as exc:
        raise RepoInvalid(str(exc), "full_name") from None
    try:
        label = checked_intake_label(
            DEFAULT_INTAKE_LABEL if intake_label is None else intake_label
        )
    except ValidationError as exc:
        raise RepoInvalid(str(exc), "intake_label") from None
    path = project_path if isinstance(project_path, str) else None
    try:
        project, _git = project_path_admit(path, hosts_snapshot())
    except ValidationError as exc:
        raise RepoInvalid(str(exc), "project_path") from None
    other = GithubRepo.objects.filter(full_name__iexact=name)
    if exclude_pk is not None:
        other = other.exclude(pk=exclude_pk)
    existing = other.first()
    if existing is not None:
        raise RepoInvalid(
            REPO_EXISTS.format(name=existing.full_name, path=existing.project_path),
            "full_name",
        )
    return RepoValues(full_name=name, project_path=project, intake_label=label)


def github_repo_save(
    *,
    full_name: str,
    project_path: str,
    intake_label: str | None = None,
    update: bool = False,
    dry_run: bool = False,
) -> tuple[GithubRepo, str]:
    """Map a repository (`repo add`): (the row, `added` / `updated` / `unchanged`).

    An existing mapping of the name is refused (REPO_EXISTS) unless `update`, which changes
    its project path and, when given, its label (its name takes the case given). Bad input
    raises RepoInvalid with nothing written; `dry_run` checks and writes nothing."""
    with transaction.atomic():
        existing = github_repo_find(full_name) if update else None
        values = github_repo_clean(
            full_name=full_name,
            project_path=project_path,
            intake_label=intake_label
            if intake_label is not None or existing is None
            else existing.intake_label,
            exclude_pk=existing.pk if existing is not None else None,
        )
        row = existing or GithubRepo()
        before = (row.full_name, row.project_path, row.intake_label)
        row.full_name = values.full_name
        row.project_path = values.project_path
        row.intake_label = values.intake_label
        if existing is None:
            verb = "added"
        else:
            changed = before != (row.full_name, row.project_path, row.intake_label)
            verb = "updated" if changed else "unchanged"
        if not dry_run and verb != "unchanged":
            try:
                with transaction.atomic():
                    row.save()
            except IntegrityError:  # mapped by another process since the check
                raise RepoInvalid(
                    REPO_EXISTS.format(name=values.full_name, path="?"), "full_name"
                ) from None
    return row, verb


def github_repo_remove(*, full_name: str, dry_run: bool = False) -> GithubRepo:
    """Unmap a repository (`repo remove`): its issues are ignored from now on; the inbox
    rows and work items it brought stay as they are."""
    name = checked_repo_name(full_name)
    with transaction.atomic():
        row = github_repo_find(name)
        if row is None:
            raise ValidationError(REPO_NOT_FOUND.format(name=name))
        if not dry_run:
            GithubRepo.objects.filter(pk=row.pk).delete()
    return row


def github_repo_to_dict(row: GithubRepo) -> dict[str, Any]:
    return {
        "fullName": row.full_name,
        "projectPath": row.project_path,
        "intakeLabel": row.intake_label,
        "createdAt": row.created_at.isoformat() if row.created_at else None,
        "updatedAt": row.updated_at.isoformat() if row.updated_at else None,
    }


# --- issues ------------------------------------------------------------------------------------

TAKE_ACTIONS = ("opened", "labeled", "edited", "reopened")
WITHDRAW_ACTIONS = ("closed", "deleted")
# `unlabeled` withdraws when the intake label went, and is an edit otherwise.
ACTIONS = (*TAKE_ACTIONS, *WITHDRAW_ACTIONS, "unlabeled")
# On a withdrawn inbox row: the action that withdrew it (module docstring).
WITHDRAWN_KEY = "github_withdrawn"
WITHDRAWN_REASON = "withdrawn on GitHub: the issue was {action}"
REOPENED_REASON = "taken again from GitHub: the issue was {action}"
UNTRUSTED_EDIT = "edited by its author, who is not trusted (label it again to take it)"
UNTRUSTED_AUTHOR = (
    "ignored: {task}: its author ({association}) is not trusted: it is taken when a "
    "maintainer applies the label {label!r}"
)
# Where the inbox stands for an issue (`_stage`).
OPEN, WITHDRAWN, ADMITTED, SETTLED = "open", "withdrawn", "admitted", "settled"
ACTION_CHARS = 40


def issue_event(
    action: str, payload: dict[str, Any], *, now: datetime | None = None
) -> str:
    """One `issues` delivery (module docstring): its outcome, one line. ValidationError when
    the payload's shape is wrong (nothing written)."""
    if not isinstance(action, str) or not action.strip():
        raise ValidationError("GitHub issues payload: action must be text")
    issue = issue_of(payload)
    outcome = _outcome(
        action.strip()[:ACTION_CHARS],
        issue,
        now or timezone.now(),
        applied_label(payload),
    )
    return terminal_text(" ".join(outcome.split()))


def _outcome(action: str, issue: Issue, now: datetime, applied: str | None) -> str:
    task = issue.task_id
    if action not in ACTIONS:
        return f"ignored: {task}: the action {action!r} is not one intake takes"
    if issue.pull_request:
        return f"ignored: {task} is a pull request"
    repo = github_repo_find(issue.repo)
    if repo is None:
        return f"ignored: repository {issue.repo} is not mapped (manage.py repo add)"
    labelled = issue.carries(repo.intake_label)
    if action in WITHDRAW_ACTIONS or (action == "unlabeled" and not labelled):
        return _withdraw(issue, repo, action, now)
    if not issue.open:
        return f"ignored: {task} is closed"
    if not labelled:
        return f"ignored: {task} does not carry the intake label {repo.intake_label!r}"
    if issue.author_association not in _trusted():
        # Anyone may open or edit an issue; only a maintainer labels one. An untrusted
        # author's issue is taken when the intake label is applied to it, with the text
        # it has then; the author's edit afterwards withdraws it until labelled again.
        if action == "edited":
            return _withdraw(issue, repo, UNTRUSTED_EDIT, now)
        label = repo.intake_label.strip().casefold()
        if action != "labeled" or (applied or "").strip().casefold() != label:
            return UNTRUSTED_AUTHOR.format(
                task=task,
                association=issue.author_association,
                label=repo.intake_label,
            )
    return _take(issue, repo, action, now)


def _trusted() -> set[str]:
    return {a.upper() for a in settings.LOOPSWEB_GITHUB_TRUSTED_ASSOCIATIONS}


def _envelope(issue: Issue, repo: GithubRepo) -> dict[str, Any]:
    envelope = issue_envelope(
        issue, project_path=repo.project_path, intake_label=repo.intake_label
    )
    parse_envelope(envelope)  # what the inbox stores must parse (no unstorable text)
    return envelope


def _take(issue: Issue, repo: GithubRepo, action: str, now: datetime) -> str:
    envelope = _envelope(issue, repo)
    known = InboxEvent.objects.filter(source=SOURCE, event_id=issue.event_id).exists()
    if not known:  # (an ingest that finds the row after all reports a duplicate)
        try:
            report = inbox_ingest([(f"{SOURCE} {issue.task_id}", envelope)])
        except IngestRejected as exc:
            raise ValidationError(str(exc)) from None
        if report.new:
            return f"queued: {issue.task_id} is inbox event {SOURCE}:{issue.event_id}"
    with transaction.atomic():
        admission_lock()  # as every writer of rows a drain may claim (routing.drains.inbox)
        row, item = _locked(issue.event_id)
        if row is None:  # pragma: no cover - rows are never deleted
            return f"unchanged: {issue.task_id} has no inbox event"
        older = older_than(issue, row.data)
        if older is not None:
            return _older(issue, older)
        stage = _stage(row, item)
        if stage == ADMITTED:
            return _admitted(issue, item, "an edit after admission changes nothing")
        if stage == SETTLED:
            return _settled(issue, row, envelope, now)
        if stage == WITHDRAWN:
            return _take_again(issue, row, item, envelope, action, now)
        return _update(issue, row, envelope, now)


def _locked(event_id: str) -> tuple[InboxEvent | None, WorkflowWorkItem | None]:
    """The issue's inbox row, locked until the transaction ends, and its work item."""
    row = (
        InboxEvent.objects.select_for_update(no_key=True)
        .filter(source=SOURCE, event_id=event_id)
        .first()
    )
    if row is None or row.work_item_id is None:
        return row, None
    return row, WorkflowWorkItem.objects.filter(pk=row.work_item_id).first()


def _stage(row: InboxEvent, item: WorkflowWorkItem | None) -> str:
    """Where the inbox stands for the issue (module docstring)."""
    waiting = (WorkItemStatus.QUEUED, WorkItemStatus.DEFERRED)
    if row.state == InboxState.ADMITTED:
        return ADMITTED
    if row.state in OPEN_INBOX_STATES:
        return OPEN if item is None or item.status in waiting else ADMITTED
    if not isinstance(row.metadata, dict) or not row.metadata.get(WITHDRAWN_KEY):
        return SETTLED
    if item is not None and item.status not in (*waiting, WorkItemStatus.CANCELLED):
        return ADMITTED
    return WITHDRAWN


def _older(issue: Issue, held: str) -> str:
    return (
        f"ignored: {issue.task_id}: an older delivery (the issue as of "
        f"{issue.updated_at}; the inbox holds it as of {held})"
    )


def _admitted(issue: Issue, item: WorkflowWorkItem | None, why: str) -> str:
    named = (
        f"work item {item.id} ({item.status})" if item is not None else "a work item"
    )
    return f"unchanged: {issue.task_id} was admitted as {named}; {why}"


def _update(
    issue: Issue, row: InboxEvent, envelope: dict[str, Any], now: datetime
) -> str:
    """An open row takes the issue's text (module docstring)."""
    if (row.data, row.metadata, row.subject) == (
        envelope["data"],
        envelope["metadata"],
        envelope["subject"],
    ):
        return (
            f"unchanged: {issue.task_id}: its inbox event ({row.state}) holds this text"
        )
    InboxEvent.objects.filter(pk=row.pk).update(
        data=envelope["data"],
        metadata=envelope["metadata"],
        subject=envelope["subject"],
        project_hint=envelope["data"]["project_path"],
        # The row's version as a drain's claim reads it: a drain that loaded the old text
        # loses its claim, and the next one routes the new text.
        route_attempts=F("route_attempts") + 1,
        updated_at=now,
    )
    if row.state == InboxState.PENDING:
        transaction.on_commit(lambda: drains_wake_after_ingest([TASK_EVENT_TYPE]))
    return f"updated: {issue.task_id}: its {row.state} inbox event holds the issue's text now"


def _settled(
    issue: Issue, row: InboxEvent, envelope: dict[str, Any], now: datetime
) -> str:
    """A row a drain skipped or failed, or an operator discarded, keeps its state and takes
    the issue's text, for the admin's Retry to route (module docstring)."""
    reason = row.last_reason or "no reason"
    if (row.data, row.metadata) == (envelope["data"], envelope["metadata"]):
        return f"unchanged: {issue.task_id}: its inbox event is {row.state} ({reason})"
    InboxEvent.objects.filter(pk=row.pk).update(
        data=envelope["data"],
        metadata=envelope["metadata"],
        subject=envelope["subject"],
        project_hint=envelope["data"]["project_path"],
        updated_at=now,
    )
    return (
        f"updated: {issue.task_id}: its inbox event is {row.state} ({reason}) and holds "
        "the issue's text now; the admin's Retry routes it again"
    )


def _take_again(
    issue: Issue,
    row: InboxEvent,
    item: WorkflowWorkItem | None,
    envelope: dict[str, Any],
    action: str,
    now: datetime,
) -> str:
    """A withdrawn row is pending again, and the work item its withdrawal cancelled is
    requeued (module docstring)."""
    reason = REOPENED_REASON.format(action=action)
    InboxEvent.objects.filter(pk=row.pk).update(
        state=InboxState.PENDING,
        data=envelope["data"],
        metadata=envelope["metadata"],
        subject=envelope["subject"],
        project_hint=envelope["data"]["project_path"],
        reason_code=None,
        last_reason=reason,
        updated_at=now,
    )
    requeued = ""
    if item is not None and item.status == WorkItemStatus.CANCELLED:
        # The inbox row is this one, written above: the requeue does not reopen it again.
        work_item_requeue(item_id=item.id, reason=reason, now=now, reopen_inbox=False)
        requeued = f", work item {item.id} requeued"
    transaction.on_commit(lambda: drains_wake_after_ingest([TASK_EVENT_TYPE]))
    return f"queued: {issue.task_id} again (inbox event pending{requeued})"


def _withdraw(issue: Issue, repo: GithubRepo, action: str, now: datetime) -> str:
    """`closed`, `deleted`, `unlabeled` of the intake label (module docstring)."""
    envelope = _envelope(issue, repo)
    with transaction.atomic():
        admission_lock()
        row, item = _locked(issue.event_id)
        if row is None:
            return f"ignored: {issue.task_id} has no inbox event to withdraw"
        older = older_than(issue, row.data)
        if older is not None:
            return _older(issue, older)
        stage = _stage(row, item)
        if stage == ADMITTED:
            why = "withdrawing it stops nothing"
            if item is not None:
                why += f" (manage.py routes cancel {item.id} does)"
            return _admitted(issue, item, why)
        if stage == WITHDRAWN:
            return f"unchanged: {issue.task_id} is withdrawn already"
        if stage == SETTLED:
            return f"unchanged: {issue.task_id}: its inbox event is {row.state} already"
        reason = WITHDRAWN_REASON.format(action=action)
        InboxEvent.objects.filter(pk=row.pk).update(
            state=InboxState.SKIPPED,
            data=envelope["data"],
            metadata={**envelope["metadata"], WITHDRAWN_KEY: action},
            reason_code=None,
            last_reason=reason,
            route_attempts=F("route_attempts") + 1,
            updated_at=now,
        )
        cancelled = ""
        if item is not None:  # queued or deferred (`_stage`): it never ran
            work_item_cancel(item_id=item.id, reason=reason, now=now)
            cancelled = f", work item {item.id} cancelled"
    return f"withdrawn: {issue.task_id} ({reason}; inbox event skipped{cancelled})"
