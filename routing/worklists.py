"""What needs an operator and what was delivered: the reads behind /ops/attention/,
/ops/delivered/, `GET /api/v1/attention`, `GET /api/v1/delivered` and the overview's
summary, so the pages and the API list the same rows.

- **Needs attention** lists work items as they stand now, one row each, of these kinds
  (`ATTENTION_KINDS`, decided from statuses and codes, never from reason text):
  `failed` (the item failed: its run failed, was lost or never ran), `timed_out` (the
  item failed because its run timed out), `dead_lettered` (the re-dispatch bound set the
  item aside: status `dead_letter` with reason code `dead_lettered`,
  ledger/services/retries.py) and `not_delivered` (its run's delivery was refused:
  `delivery_json.state` is `failed`) and `needs_human` (its revisions are spent or its
  verifier escalated: status `needs_human`, docs/revisions.md §4). An item that is
  retried, requeued, cancelled or dead-lettered by an operator leaves the list; a
  redelivery that goes through takes it off too.
- **Delivered** lists runs whose work went out (`delivery_json.state` is `delivered`): a
  pushed branch, and the pull request when one was opened, with its state as last
  recorded (`open`, `closed`, `merged`; `pushed`: no pull request).

Each page of rows costs a fixed number of queries: the rows with their item, run and
invocation (one join), then the page's steps and their attempts (one query each), from
which the accounts used and the tokens and cost are summed (ledger.display).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.db.models import Count, Prefetch, Q, QuerySet
from django.utils import timezone

from ledger.display import UsageSum, step_usage
from ledger.models import (
    RunStatus,
    StepReasonCode,
    StepStatus,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.services.retries import DEAD_LETTERED_CODE
from ledger.webkit.cells import task_title
from runs.delivery_view import pull_request

FAILED = "failed"
TIMED_OUT = "timed_out"
DEAD_LETTERED = DEAD_LETTERED_CODE  # "dead_lettered", the item's reason code
NOT_DELIVERED = "not_delivered"
NEEDS_HUMAN = (
    "needs_human"  # the item's status: its revisions are spent (docs/revisions.md)
)
ATTENTION_KINDS = {
    NEEDS_HUMAN: "needs a human",
    FAILED: "failed",
    TIMED_OUT: "timed out",
    DEAD_LETTERED: "dead-lettered",
    NOT_DELIVERED: "not delivered",
}
PUSHED = "pushed"  # delivered without a pull request
DELIVERED_STATES = {
    "open": "pull request open",
    "merged": "pull request merged",
    "closed": "pull request closed",
    PUSHED: "branch pushed, no pull request",
}
DELIVERY_FAILED_STATE = "failed"  # runs.delivery's record: the delivery was refused
DELIVERY_DONE_STATE = "delivered"

SINCE_INVALID = (
    "since must be a duration back from now (24h, 7d) or a UTC date or time "
    "(2026-11-29, 2026-11-29T16:00:00Z)"
)
SINCE_MAX_DAYS = 3650
_SINCE_AGO = re.compile(r"^(\d{1,5})([hd])$", re.ASCII)


# --- filters (the query strings of the pages and the API) --------------------------------------


def parse_since(text: str, *, now: datetime) -> datetime:
    """`24h`, `7d` (back from `now`, at most SINCE_MAX_DAYS) or an ISO date or time (UTC
    unless it names its offset); ValidationError otherwise."""
    value = text.strip()
    ago = _SINCE_AGO.match(value.lower())
    if ago:
        hours = int(ago.group(1)) * (24 if ago.group(2) == "d" else 1)
        if hours > SINCE_MAX_DAYS * 24:
            raise forms.ValidationError(SINCE_INVALID)
        return now - timedelta(hours=hours)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise forms.ValidationError(SINCE_INVALID) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if not datetime(1970, 1, 1, tzinfo=UTC) <= moment <= now + timedelta(days=1):
        raise forms.ValidationError(SINCE_INVALID)
    return moment.astimezone(UTC)


class SinceField(forms.CharField):
    """`since`: the moment it names (None when not given)."""

    def __init__(self) -> None:
        super().__init__(required=False, max_length=40)

    def clean(self, value: Any) -> datetime | None:
        text = super().clean(value)
        return parse_since(text, now=timezone.now()) if text else None


class WorklistFilterForm(forms.Form):
    project = forms.CharField(required=False, max_length=4000)
    route_scope = forms.CharField(required=False, max_length=200)
    since = SinceField()
    filter_names: tuple[str, ...] = ("project", "route_scope", "since")

    def first_error(self) -> str:
        for name, errors in self.errors.items():
            return f"{'' if name == '__all__' else f'{name}: '}{errors[0]}"
        return "invalid query"


class AttentionFilterForm(WorklistFilterForm):
    kind = forms.ChoiceField(
        required=False, choices=[("", "any"), *ATTENTION_KINDS.items()]
    )
    filter_names = ("kind", *WorklistFilterForm.filter_names)


class DeliveredFilterForm(WorklistFilterForm):
    state = forms.ChoiceField(
        required=False, choices=[("", "any"), *DELIVERED_STATES.items()]
    )
    filter_names = ("state", *WorklistFilterForm.filter_names)


def filters_of(form: WorklistFilterForm) -> dict[str, Any]:
    """A valid filter form's filters (keyword arguments of `attention_items` or
    `delivered_runs`), None for those not given."""
    return {name: form.cleaned_data.get(name) or None for name in form.filter_names}


# --- the rows -----------------------------------------------------------------------------------

# What a row reads of its run (no output, no patch-sized columns).
_RUN_FIELDS = (
    "id",
    "status",
    "error",
    "finished_at",
    "delivery_json",
    "work_discarded_at",
    "worktree_branch",
)
_STEP_FIELDS = (
    "id",
    "workflow_run",
    "step_id",
    "sequence",
    "status",
    "reason_code",
    "account_profile",
    "usage_input_tokens",
    "usage_output_tokens",
    "usage_cached_tokens",
    "usage_cost_usd",
)
_ATTEMPT_FIELDS = (
    "id",
    "step_run",
    "account_profile",
    "started_at",
    "usage_input_tokens",
    "usage_output_tokens",
    "usage_cached_tokens",
    "usage_cost_usd",
)


def _steps_prefetch(prefix: str) -> list[Prefetch]:
    return [
        Prefetch(
            f"{prefix}step_runs",
            queryset=WorkflowStepRun.objects.only(*_STEP_FIELDS).order_by("sequence"),
        ),
        Prefetch(
            f"{prefix}step_runs__attempts",
            queryset=WorkflowStepAttempt.objects.only(*_ATTEMPT_FIELDS).order_by(
                "started_at", "id"
            ),
        ),
    ]


def _undelivered_runs() -> QuerySet[WorkflowRun, Any]:
    return WorkflowRun.objects.filter(
        delivery_json__state=DELIVERY_FAILED_STATE
    ).values("id")


def _kind_filters() -> dict[str, Q]:
    timed_out = Q(workflow_run__status=RunStatus.TIMED_OUT)
    return {
        FAILED: Q(status=WorkItemStatus.FAILED) & ~timed_out,
        TIMED_OUT: Q(status=WorkItemStatus.FAILED) & timed_out,
        DEAD_LETTERED: Q(
            status=WorkItemStatus.DEAD_LETTER, reason_code=DEAD_LETTERED_CODE
        ),
        NOT_DELIVERED: Q(workflow_run_id__in=_undelivered_runs()),
        NEEDS_HUMAN: Q(status=WorkItemStatus.NEEDS_HUMAN),
    }


def _common_filters(item: str, time_field: str, **given: Any) -> dict[str, Any]:
    """The lookups of `project`, `route_scope` and `since` that were given; `item`: the
    path to the work item ("" or "work_item__")."""
    lookups = {
        "project": f"{item}project_key",
        "route_scope": f"{item}route_scope",
        "since": f"{time_field}__gte",
    }
    return {lookups[name]: value for name, value in given.items() if value}


def attention_items(
    *,
    kind: str | None = None,
    project: str | None = None,
    route_scope: str | None = None,
    since: datetime | None = None,
) -> QuerySet[WorkflowWorkItem]:
    """Items that need attention now (module docstring), newest change first."""
    kinds = _kind_filters()
    needs = (
        kinds[kind]
        if kind
        else Q(status=WorkItemStatus.FAILED)
        | kinds[DEAD_LETTERED]
        | kinds[NOT_DELIVERED]
        | kinds[NEEDS_HUMAN]
    )
    items = WorkflowWorkItem.objects.filter(
        needs,
        **_common_filters(
            "", "updated_at", project=project, route_scope=route_scope, since=since
        ),
    )
    return (
        items.select_related("invocation", "workflow_run")
        .only(
            "id",
            "status",
            "route_key",
            "route_scope",
            "project_key",
            "subject_ref",
            "last_reason",
            "reason_code",
            "attempts",
            "updated_at",
            "invocation__subject_json",
            *(f"workflow_run__{name}" for name in _RUN_FIELDS),
        )
        .prefetch_related(*_steps_prefetch("workflow_run__"))
        .order_by("-updated_at", "-id")
    )


def attention_counts() -> dict[str, int]:
    """Items per kind of attention (an item may be of two kinds). Two queries, each on an
    index: the failed, dead-lettered and needs-a-human items by their run's status, their
    reason code and their status; the items of runs not delivered."""
    kinds = _kind_filters()
    found = WorkflowWorkItem.objects.filter(
        status__in=(
            WorkItemStatus.FAILED,
            WorkItemStatus.DEAD_LETTER,
            WorkItemStatus.NEEDS_HUMAN,
        )
    ).aggregate(
        **{
            kind: Count("pk", filter=kinds[kind])
            for kind in (FAILED, TIMED_OUT, DEAD_LETTERED, NEEDS_HUMAN)
        }
    )
    found[NOT_DELIVERED] = WorkflowWorkItem.objects.filter(kinds[NOT_DELIVERED]).count()
    return {kind: int(found.get(kind) or 0) for kind in ATTENTION_KINDS}


def attention_summary() -> list[tuple[str, str, int]]:
    """(kind, label, items) for each kind of attention, in ATTENTION_KINDS' order."""
    counts = attention_counts()
    return [(kind, label, counts[kind]) for kind, label in ATTENTION_KINDS.items()]


def delivered_runs(
    *,
    state: str | None = None,
    project: str | None = None,
    route_scope: str | None = None,
    since: datetime | None = None,
) -> QuerySet[WorkflowRun]:
    """Runs whose work was delivered (module docstring), last finished first."""
    runs = WorkflowRun.objects.filter(
        delivery_json__state=DELIVERY_DONE_STATE,
        finished_at__isnull=False,
        **_common_filters(
            "work_item__",
            "finished_at",
            project=project,
            route_scope=route_scope,
            since=since,
        ),
    )
    if state == PUSHED:
        runs = runs.exclude(delivery_json__has_key="pr")
    elif state:
        runs = runs.filter(delivery_json__pr__state=state)
    return (
        runs.select_related("work_item__invocation")
        .only(
            *_RUN_FIELDS,
            "work_item",
            "work_item__id",
            "work_item__status",
            "work_item__route_scope",
            "work_item__project_key",
            "work_item__subject_ref",
            "work_item__invocation__subject_json",
        )
        .prefetch_related(*_steps_prefetch(""))
        .order_by("-finished_at", "-id")
    )


@dataclass(frozen=True)
class RunSpend:
    """The accounts a run's steps used (in the order they were first used) and its tokens
    and cost over every attempt."""

    accounts: list[str] = field(default_factory=list)
    usage: UsageSum = UsageSum()
    # The step that ended the run badly (the last failed or timed-out one), if any.
    failed_step: WorkflowStepRun | None = None


def run_spend(run: WorkflowRun | None) -> RunSpend:
    """From the run's prefetched steps and attempts (`_steps_prefetch`): no query."""
    if run is None:
        return RunSpend()
    accounts: dict[str, None] = {}
    usage = UsageSum()
    failed: WorkflowStepRun | None = None
    for step in run.step_runs.all():
        attempts = list(step.attempts.all())
        for profile in [a.account_profile for a in attempts] + [step.account_profile]:
            if profile:
                accounts.setdefault(profile)
        usage = usage + step_usage(step, attempts)
        if step.status in (StepStatus.FAILED, StepStatus.TIMED_OUT):
            failed = step
    return RunSpend(list(accounts), usage, failed)


def step_reason_label(code: str | None) -> str:
    """A step's reason code as words (`login failed`), "" for none."""
    if not code or code not in StepReasonCode.values:
        return ""
    return str(StepReasonCode(code).label)


@dataclass(frozen=True)
class AttentionRow:
    item: WorkflowWorkItem
    run: WorkflowRun | None
    title: str
    kinds: list[str]
    # why it failed or was dead-lettered ("" when neither)
    reason: str
    delivery_error: str  # why its delivery was refused ("" when it was not)
    spend: RunSpend

    @property
    def labels(self) -> list[str]:
        return [ATTENTION_KINDS[kind] for kind in self.kinds]

    @property
    def step_reason(self) -> str:
        """The failed step's reason code as words (`login failed`), "" for none."""
        step = self.spend.failed_step
        return step_reason_label(step.reason_code) if step is not None else ""


def attention_rows(items: Iterable[WorkflowWorkItem]) -> list[AttentionRow]:
    """The rows of items from `attention_items` (no further query)."""
    rows = []
    for item in items:
        run = item.workflow_run if item.workflow_run_id else None
        record = run.delivery_json if run is not None else None
        record = record if isinstance(record, dict) else {}
        kinds = []
        failed = item.status == WorkItemStatus.FAILED
        if failed:
            timed_out = run is not None and run.status == RunStatus.TIMED_OUT
            kinds.append(TIMED_OUT if timed_out else FAILED)
        dead = (
            item.status == WorkItemStatus.DEAD_LETTER
            and item.reason_code == DEAD_LETTERED_CODE
        )
        if dead:
            kinds.append(DEAD_LETTERED)
        undelivered = record.get("state") == DELIVERY_FAILED_STATE
        if undelivered:
            kinds.append(NOT_DELIVERED)
        error = (run.error if run is not None else None) or ""
        reason = ""
        if failed:
            reason = error or item.last_reason or ""
        elif dead:  # `re-dispatched N times: dead-lettered (<the run's error>)`
            reason = item.last_reason or error
        rows.append(
            AttentionRow(
                item=item,
                run=run,
                title=task_title(item.invocation.subject_json, item.subject_ref),
                kinds=kinds,
                reason=reason,
                delivery_error=str(record.get("error") or "") if undelivered else "",
                spend=run_spend(run),
            )
        )
    return rows


@dataclass(frozen=True)
class DeliveredRow:
    run: WorkflowRun
    item: WorkflowWorkItem | None
    title: str
    state: str  # a DELIVERED_STATES key
    pr: dict[str, Any] | None
    pr_link: str | None  # the pull request's web address, when it is an http(s) one
    branch: str
    commit: str
    remote: str
    delivered_at: datetime | None
    spend: RunSpend


def _moment(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


def web_link(url: Any) -> str | None:
    """`url` when it is an http(s) address (a link may be made of it), else None."""
    text = str(url or "")
    return text if text.startswith(("https://", "http://")) else None


def delivered_rows(runs: Iterable[WorkflowRun]) -> list[DeliveredRow]:
    """The rows of runs from `delivered_runs` (no further query)."""
    rows = []
    for run in runs:
        record = run.delivery_json if isinstance(run.delivery_json, dict) else {}
        pr = pull_request(run)
        item = run.work_item if run.work_item_id else None
        ref = str(record.get("ref") or "")
        rows.append(
            DeliveredRow(
                run=run,
                item=item,
                title=task_title(item.invocation.subject_json, item.subject_ref)
                if item is not None
                else run.id,
                state=str(pr.get("state") or "open") if pr else PUSHED,
                pr=pr,
                pr_link=web_link(pr.get("url")) if pr else None,
                branch=ref.removeprefix("refs/heads/") or (run.worktree_branch or ""),
                commit=str(record.get("commit") or ""),
                remote=str(record.get("url") or ""),
                delivered_at=_moment(record.get("pushedAt")) or run.finished_at,
                spend=run_spend(run),
            )
        )
    return rows
