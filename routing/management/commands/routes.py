"""Upstream's work-item operator commands (`loops routes ...`, docs/upstream.md §2.1).

    routes list [--status S] [--route-key K] [--limit N] [--json]
    routes show ITEM_ID [--json]
    routes requeue ITEM_ID --reason TEXT [--dry-run] [--json]
    routes retry ITEM_ID [--reason TEXT] [--json]
    routes cancel ITEM_ID [--reason TEXT] [--json]
    routes invocations [--limit N] [--json]

`list` orders as upstream: with --status by priority (high first) then oldest first (the
admission order), otherwise newest first. `requeue` requires a reason and keeps attempts
(0.4.12); the item's inbox events reopen so the next drain admits it again. `show` adds the
item's runs, one per attempt, with how each ended, and under each run its steps' attempts
(`worker: cx-a → rate limited after 0.6 s → cx-b, succeeded in 1.4 s`). `retry` re-admits a
finished item now with the route it stores (provider, pool, scope, caps, template, sandbox,
worktree mode, time limits; a capped retry is deferred with its reason); `cancel` cancels a
queued, deferred, admitted or running item (a run in progress with it).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models import Prefetch

from domain.bounds import BOUNDS, bounded_int
from domain.delivery import DEFAULT_DELIVER, DEFAULT_REMOTE
from domain.errors import ApplicationError, ValidationError
from domain.revisions import max_revisions
from domain.windows import DEFAULT_MAX_WINDOW_USED
from ledger.item_read import item_rounds
from ledger.management.terminal import TerminalCommand
from ledger.models import (
    WorkflowInvocation,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.services import (
    CANCEL_REASON_DEFAULT,
    work_item_cancel,
    work_item_requeue,
)
from ledger.services.common import (
    REQUEUE_REASON_REQUIRED,
    REQUEUEABLE_STATUSES,
    WORK_ITEM_NOT_FOUND,
    WORK_ITEM_NOT_REQUEUEABLE,
)
from routing.admission import retry_outcome, retry_work_item, work_item_to_dict
from routing.api.serializers import iso, step_to_dict, with_attempts
from runs.delivery_view import delivery_fields, delivery_line

ROUTE_ITEM_NOT_FOUND = "route work item not found: {item_id}"
# Who the run's `operator_<action>` event names for a retry or cancel from this command.
CLI_ACTOR = "manage.py routes"
DEFAULT_LIMIT = 50
MAX_LIMIT = BOUNDS["routes --limit"].maximum


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    try:
        limit = bounded_int("--limit", value, key="routes --limit")
    except ValidationError:
        raise CommandError(
            f"--limit must be a whole number from 1 to {MAX_LIMIT}"
        ) from None
    return DEFAULT_LIMIT if limit is None else limit


def _run_dict(run: WorkflowRun, attempt: int) -> dict[str, Any]:
    return {
        "id": run.id,
        "attempt": attempt,
        "status": run.status,
        "loopId": run.loop_id,
        "scheduledFor": iso(run.scheduled_for),
        "startedAt": iso(run.started_at),
        "finishedAt": iso(run.finished_at),
        "error": run.error,
        # loopsweb: each step with its attempts (an account per try) and its usage
        "steps": [step_to_dict(step) for step in run.step_runs.all()],
        # The run's work: branch, commits, diffstat, delivery and pull request
        "branch": run.worktree_branch,
        **delivery_fields(run),
        "deliveryText": delivery_line(run),
    }


def item_runs(item: WorkflowWorkItem) -> list[dict[str, Any]]:
    """The item's runs oldest first, each numbered as its attempt (`with_attempts`)."""
    runs = (
        WorkflowRun.objects.filter(work_item_id=item.id)
        .order_by("created_at", "id")
        .prefetch_related(
            Prefetch(
                "step_runs",
                queryset=WorkflowStepRun.objects.order_by("sequence").defer(
                    "stdout", "stderr"
                ),
            ),
            Prefetch(
                "step_runs__attempts",
                queryset=WorkflowStepAttempt.objects.order_by("started_at", "id"),
            ),
        )
    )
    return [_run_dict(run, attempt) for run, attempt in with_attempts(runs)]


def route_delivery(item: WorkflowWorkItem) -> dict[str, Any]:
    """The item's route's delivery options (`--deliver` ...), defaults filled in."""
    route: Any = item.route_options_json
    stored = route.get("options") if isinstance(route, dict) else None
    options = stored if isinstance(stored, dict) else {}
    return {
        "deliver": options.get("deliver") or DEFAULT_DELIVER,
        "deliverRemote": options.get("deliver_remote") or DEFAULT_REMOTE,
        "deliverFailed": options.get("deliver_failed") is True,
        "githubRepo": options.get("github_repo"),
        "githubReviewers": [
            login
            for login in str(options.get("github_reviewer") or "").split(",")
            if login
        ],
    }


def route_max_window_used(item: WorkflowWorkItem) -> Any:
    """The item's route's --max-window-used as stored (a fraction or `off`), else 0.9."""
    value = item.route_option("max_window_used")
    return DEFAULT_MAX_WINDOW_USED if value is None else value


def _show_value(item: WorkflowWorkItem) -> dict[str, Any]:
    """`routes show --json`: the item with its invocation, workflow, loop, runs and
    delivery options."""
    invocation = item.invocation
    return {
        # Upstream's `routes show` answers `item`; `workItem` is loopsweb's name for it.
        "item": work_item_to_dict(item),
        "workItem": work_item_to_dict(item),
        "invocation": {
            "id": invocation.id,
            "templateId": invocation.template_id,
            "sourceKind": invocation.source_kind,
            "sourceId": invocation.source_id,
            "sourceDedupeKey": invocation.source_dedupe_key,
            "subjectKind": invocation.subject_kind,
            "subjectId": invocation.subject_id,
            "subjectPath": invocation.subject_path,
            "intent": invocation.intent,
        },
        "workflow": {
            "id": item.workflow.id,
            "name": item.workflow.name,
            "status": item.workflow.status,
        }
        if item.workflow
        else None,
        "loop": {
            "id": item.loop.id,
            "name": item.loop.name,
            "status": item.loop.status,
            "maxAttempts": item.loop.max_attempts,
            "retryDelayMs": item.loop.retry_delay_ms,
        }
        if item.loop
        else None,
        "runs": item_runs(item),
        "deliver": route_delivery(item),
        "maxWindowUsed": route_max_window_used(item),
        "maxRevisions": max_revisions(item.route_option("max_revisions")),
        "revisions": item_rounds(item.id),
    }


def _show_lines(item: WorkflowWorkItem, value: dict[str, Any]) -> list[str]:
    """`routes show` as text: the item, its route's options, workflow, loop, and each run
    with its delivery and its steps' attempts."""
    wi = value["workItem"]
    lines = [
        f"work item {wi['id']}: {wi['status']} (attempts {wi['attempts']})",
        f"  route {wi['routeKey']} scope {wi['routeScope']}  key {wi['idempotencyKey']}",
        f"  reason: {wi['lastReason'] or '-'}",
        f"  invocation {item.invocation.id} ({item.invocation.template_id})",
    ]
    deliver = value["deliver"]
    lines.append(
        f"  deliver {deliver['deliver']} (remote {deliver['deliverRemote']}"
        + (", failed runs too" if deliver["deliverFailed"] else "")
        + (f", GitHub {deliver['githubRepo']}" if deliver["githubRepo"] else "")
        + (
            f", reviewers {','.join(deliver['githubReviewers'])}"
            if deliver["githubReviewers"]
            else ""
        )
        + ")"
    )
    if value["maxWindowUsed"] != DEFAULT_MAX_WINDOW_USED:
        lines.append(f"  --max-window-used {value['maxWindowUsed']}")
    if item.workflow:
        lines.append(f"  workflow {item.workflow_id} {item.workflow.name}")
    if item.loop:
        lines.append(
            f"  loop {item.loop_id} {item.loop.status} max_attempts={item.loop.max_attempts}"
        )
    for run in value["runs"]:
        lines.append(
            f"  run {run['id']} attempt {run['attempt']}: {run['status']}"
            + (f" — {run['error']}" if run["error"] else "")
        )
        if run["deliveryText"]:
            lines.append(f"    delivery: {run['deliveryText']}")
        for step in run["steps"]:
            if step["attemptsText"]:
                lines.append(f"    {step['attemptsText']}")
    lines += _round_lines(value)
    return lines


def _round_lines(value: dict[str, Any]) -> list[str]:
    """The item's revisions (docs/revisions.md §6), one line each, the first line of their
    findings (untrusted: the command's output escapes control characters) below."""
    lines = []
    for r in value["revisions"]:
        spent = f"tokens {r['tokens']}" + (
            f", ${r['costUsd']:.2f}" if r["costUsd"] is not None else ""
        )
        lines.append(
            f"  revision {r['round'] or '-'} of {value['maxRevisions']} "
            f"({r['trigger']}): {r['state']}"
            + (f", run {r['runId']}" if r["runId"] else "")
            + (f" on {','.join(r['accounts'])}, {spent}" if r["accounts"] else "")
            + (f" — {r['reason']}" if r["reason"] else "")
        )
        first = (r["findings"] or "").strip().splitlines()[:1]
        if first:
            lines.append(f"    findings: {first[0][:200]}")
    return lines


class Command(TerminalCommand):
    help = (
        "Work items as upstream's `routes` commands: list, show, requeue, invocations."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        listing = actions.add_parser("list", help="list work items")
        listing.add_argument("--status", choices=WorkItemStatus.values)
        listing.add_argument("--route-key")
        listing.add_argument("--limit", help=f"most rows (default {DEFAULT_LIMIT})")
        show = actions.add_parser(
            "show", help="one work item with its invocation, workflow, loop and runs"
        )
        show.add_argument("item_id")
        requeue = actions.add_parser("requeue", help="requeue a finished work item")
        requeue.add_argument("item_id")
        requeue.add_argument("--reason", help="why (required)")
        requeue.add_argument(
            "--dry-run",
            action="store_true",
            help="say what would happen, change nothing",
        )
        retry = actions.add_parser(
            "retry", help="re-admit a finished work item now with its stored route"
        )
        cancel = actions.add_parser("cancel", help="cancel an open work item")
        for sub in (retry, cancel):
            sub.add_argument("item_id")
            sub.add_argument("--reason", help="why (optional)")
        invocations = actions.add_parser(
            "invocations", help="list invocations, newest first"
        )
        invocations.add_argument("--limit", help=f"most rows (default {DEFAULT_LIMIT})")
        for sub in (listing, show, requeue, retry, cancel, invocations):
            sub.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            getattr(self, f"_{action}")(options)
        except ApplicationError as exc:
            raise CommandError(str(exc)) from None

    def _emit(self, options: dict[str, Any], value: Any, lines: list[str]) -> None:
        if options["json"]:
            self.stdout.write(json.dumps(value, sort_keys=True))
        else:
            for line in lines:
                self.stdout.write(line)

    def _list(self, options: dict[str, Any]) -> None:
        limit = _limit(options["limit"])
        items = WorkflowWorkItem.objects.all()
        if options["route_key"]:
            items = items.filter(route_key=options["route_key"].strip())
        if options["status"]:
            # idx_workflow_work_items_status_next serves this order.
            items = items.filter(status=options["status"]).order_by(
                "-priority", "created_at", "id"
            )
        else:
            items = items.order_by("-created_at", "-id")
        rows = [work_item_to_dict(item) for item in items[:limit]]
        lines = [
            f"{r['id']}  {r['status']}  attempts={r['attempts']}  {r['routeKey']}  "
            f"{r['idempotencyKey']}  {r['lastReason'] or ''}".rstrip()
            for r in rows
        ] or ["routes: no work items"]
        self._emit(options, rows, lines)

    def _show(self, options: dict[str, Any]) -> None:
        item_id = options["item_id"].strip()
        item = (
            WorkflowWorkItem.objects.select_related("invocation", "workflow", "loop")
            .filter(pk=item_id)
            .first()
        )
        if item is None:
            raise CommandError(ROUTE_ITEM_NOT_FOUND.format(item_id=item_id))
        value = _show_value(item)
        self._emit(options, value, _show_lines(item, value))

    def _requeue(self, options: dict[str, Any]) -> None:
        reason = (options["reason"] or "").strip()
        if not reason:
            raise CommandError(REQUEUE_REASON_REQUIRED)
        item_id = options["item_id"].strip()
        if options["dry_run"]:
            item = WorkflowWorkItem.objects.filter(pk=item_id).first()
            if item is None:
                raise CommandError(WORK_ITEM_NOT_FOUND.format(item_id=item_id))
            if item.status not in REQUEUEABLE_STATUSES:
                raise CommandError(
                    WORK_ITEM_NOT_REQUEUEABLE.format(
                        item_id=item.id, status=item.status
                    )
                )
            value = {**work_item_to_dict(item), "wouldRequeue": True, "dryRun": True}
            self._emit(
                options,
                value,
                [f"routes: would requeue {item.id} from {item.status} ({reason})"],
            )
            return
        before = (
            WorkflowWorkItem.objects.filter(pk=item_id)
            .values_list("status", flat=True)
            .first()
        )
        item = work_item_requeue(item_id=item_id, reason=reason)
        self._emit(
            options,
            work_item_to_dict(item),
            [
                f"routes: requeued {item.id} from {before} (attempts {item.attempts} kept): {reason}"
            ],
        )

    def _retry(self, options: dict[str, Any]) -> None:
        item = retry_work_item(
            item_id=options["item_id"].strip(),
            reason=(options["reason"] or "").strip() or None,
            actor=CLI_ACTOR,
        )
        self._emit(options, work_item_to_dict(item), [f"routes: {retry_outcome(item)}"])

    def _cancel(self, options: dict[str, Any]) -> None:
        item = work_item_cancel(
            item_id=options["item_id"].strip(),
            reason=(options["reason"] or "").strip() or CANCEL_REASON_DEFAULT,
            actor=CLI_ACTOR,
        )
        self._emit(
            options,
            work_item_to_dict(item),
            [f"routes: cancelled {item.id} ({item.last_reason})"],
        )

    def _invocations(self, options: dict[str, Any]) -> None:
        limit = _limit(options["limit"])
        rows = [
            {
                "id": inv.id,
                "templateId": inv.template_id,
                "sourceKind": inv.source_kind,
                "sourceId": inv.source_id,
                "sourceDedupeKey": inv.source_dedupe_key,
                "subjectKind": inv.subject_kind,
                "subjectId": inv.subject_id,
                "subjectPath": inv.subject_path,
                "intent": inv.intent,
                "createdAt": iso(inv.created_at),
            }
            for inv in WorkflowInvocation.objects.order_by("-created_at", "-id")[:limit]
        ]
        lines = [
            f"{r['id']}  {r['createdAt']}  {r['templateId']}  {r['sourceDedupeKey']}"
            for r in rows
        ] or ["routes: no invocations"]
        self._emit(options, rows, lines)
