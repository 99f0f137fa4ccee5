"""JSON shapes of the API: `<thing>_to_dict` functions returning TypedDicts.

Keys are camelCase like upstream's reports (docs/design.md, "upstream's semantics in
Django's shape"); times are ISO 8601 in UTC with a `Z`. Step output and drain evidence stay out of lists; details carry what the ops pages show.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from ledger.display import UsageSum, attempts_story, row_usage, step_usage
from ledger.item_read import item_rounds
from ledger.models import (
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkflowWorkItem,
    WorkItemDeferral,
)
from routing.admission import work_item_to_dict
from routing.models import DrainRecord, InboxEvent
from routing.selectors import AccountRow, UsageTotals
from runs.delivery_view import delivery_fields


def iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.isoformat().replace("+00:00", "Z")


# --- cursors ----------------------------------------------------------------------------------


def cursor_encode(key: tuple[datetime, str]) -> str:
    """An opaque page cursor: clients pass it back and never build one."""
    raw = json.dumps([key[0].isoformat(), key[1]], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def cursor_decode(cursor: str) -> tuple[datetime, str]:
    """The (timestamp, id) key of a cursor; ValueError when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        moment, row_id = json.loads(raw)
        parsed = datetime.fromisoformat(moment)
    except (binascii.Error, ValueError, TypeError):
        raise ValueError("invalid cursor") from None
    # Ids are printable ASCII; a forged cursor must not carry NUL or lone surrogates into
    # the WHERE clause, where PostgreSQL raises instead of matching nothing.
    if not (isinstance(row_id, str) and row_id.isascii() and row_id.isprintable()):
        raise ValueError("invalid cursor")
    # Our cursors carry UTC times (+00:00). Any other offset is forged, and may be one the
    # database cannot take (+23:59: PostgreSQL's "time zone displacement out of range") or an
    # instant past datetime's range once in UTC (9999-12-31T23:59:59-14:00 overflows in the
    # SQLite adapter): a bad cursor, never a database error.
    if parsed.tzinfo is None or parsed.utcoffset() != timedelta(0):
        raise ValueError("invalid cursor")
    parsed = parsed.replace(tzinfo=UTC)
    return parsed, row_id


# --- work items -------------------------------------------------------------------------------


class WorkItemDict(TypedDict):
    id: str
    routeKey: str
    idempotencyKey: str
    status: str
    attempts: int
    routeScope: str | None
    projectKey: str | None
    projectGroup: str | None
    lastReason: str | None
    reasonCode: str | None
    workflowId: str | None
    loopId: str | None
    workflowRunId: str | None
    sourceType: str
    sourceRef: str
    subjectRef: str
    createdAt: str | None
    updatedAt: str | None


class DeferralDict(TypedDict):
    id: str
    reasonCode: str
    reason: str
    routeScope: str | None
    projectKey: str | None
    projectGroup: str | None
    counts: Any
    limits: Any
    createdAt: str | None


class TokensDict(TypedDict):
    inputTokens: int | None
    outputTokens: int | None
    cachedTokens: int | None
    costUsd: float | None


class AttemptDict(TypedDict):
    # One try of the step on one account (ledger.services.attempts): running, succeeded,
    # failed, timed_out, cancelled or rate_limited.
    accountProfile: str | None
    accountTool: str | None
    status: str
    startedAt: str | None
    finishedAt: str | None
    durationMs: int | None
    exitCode: int | None
    error: str | None
    usage: TokensDict | None


class StepDict(TypedDict):
    id: str
    stepId: str
    sequence: int
    status: str
    accountProfile: str | None
    accountTool: str | None
    startedAt: str | None
    finishedAt: str | None
    exitCode: int | None
    durationMs: int | None
    error: str | None
    # Processes the step left running that the step guard ended (agents.stepguard).
    processesEnded: int | None
    egressRefused: dict[str, int] | None
    # Its tries in order, one per account it ran on (a move after a rate limit, a retry),
    # and the same as one line: "worker: cx-a → rate limited after 0.6 s → cx-b, ...".
    attempts: list[AttemptDict]
    attemptsText: str
    # Tokens and cost over all its attempts; None when the agent reported none.
    usage: TokensDict | None
    # The commit of what the step changed on the run's branch, or None.
    commitSha: str | None
    # A verifier's verdict (approve, changes, escalate) and its text; None for other steps.
    verdict: str | None
    verdictText: str | None


class RunDict(TypedDict):
    id: str
    workflowName: str
    status: str
    # Its number among the runs of its loop (one admission): a loop-level retry is the next.
    attempt: int | None
    loopId: str | None
    scheduledFor: str | None
    createdAt: str | None
    startedAt: str | None
    finishedAt: str | None
    durationMs: int | None
    error: str | None
    # Where the run worked and what it left (runs.worktrees): the worktree and branch, the
    # branch's head after the run's commit, and, when the work could not be committed, why
    # and where it is kept.
    worktreePath: str | None
    branch: str | None
    commitHead: str | None
    workNotCommitted: str | None
    # The run's work (runs.delivery_view.delivery_fields): its diffstat, one
    # commit per step that changed files, what was delivered and its pull request.
    diffstat: str | None
    commits: list[dict[str, Any]]
    delivery: dict[str, Any] | None
    pullRequest: dict[str, Any] | None
    workDiscardedAt: str | None
    steps: list[StepDict]
    # Tokens and cost of its steps; None when no step reported any.
    usage: TokensDict | None


class InboxRefDict(TypedDict):
    id: str
    source: str
    eventId: str
    type: str
    state: str
    receivedAt: str | None


class WorkItemDetailDict(WorkItemDict):
    deferrals: list[DeferralDict]
    runs: list[RunDict]
    inboxEvents: list[InboxRefDict]
    # Tokens and cost of all its runs; None when no step reported any.
    usage: TokensDict | None
    # The PR review gate's reading when it applied (a todos task reviewing a PR):
    # its invocation's scope_json.prReviewRouting; None for any other item.
    prReviewRouting: dict[str, Any] | None
    # Its revisions, oldest first (ledger.item_read.item_rounds, docs/revisions.md §6).
    revisions: list[dict[str, Any]]


def work_item_summary(item: WorkflowWorkItem) -> WorkItemDict:
    # work_item_to_dict is the admission report's shape; the API adds source and timestamps.
    base = work_item_to_dict(item)
    return WorkItemDict(
        id=base["id"],
        routeKey=base["routeKey"],
        idempotencyKey=base["idempotencyKey"],
        status=base["status"],
        attempts=base["attempts"],
        routeScope=base["routeScope"],
        projectKey=base["projectKey"],
        projectGroup=base["projectGroup"],
        lastReason=base["lastReason"],
        reasonCode=base["reasonCode"],
        workflowId=base["workflowId"],
        loopId=base["loopId"],
        workflowRunId=base["workflowRunId"],
        sourceType=item.source_type,
        sourceRef=item.source_ref,
        subjectRef=item.subject_ref,
        createdAt=iso(item.created_at),
        updatedAt=iso(item.updated_at),
    )


def deferral_to_dict(deferral: WorkItemDeferral) -> DeferralDict:
    return DeferralDict(
        id=deferral.id,
        reasonCode=deferral.reason_code,
        reason=deferral.reason,
        routeScope=deferral.route_scope,
        projectKey=deferral.project_key,
        projectGroup=deferral.project_group,
        counts=deferral.counts_json,
        limits=deferral.limits_json,
        createdAt=iso(deferral.created_at),
    )


def tokens_dict(usage: UsageSum) -> TokensDict | None:
    if not usage.reported:
        return None
    return TokensDict(
        inputTokens=usage.input_tokens,
        outputTokens=usage.output_tokens,
        cachedTokens=usage.cached_tokens,
        costUsd=usage.cost_usd,
    )


def attempt_to_dict(attempt: WorkflowStepAttempt) -> AttemptDict:
    return AttemptDict(
        accountProfile=attempt.account_profile,
        accountTool=attempt.account_tool,
        status=attempt.status,
        startedAt=iso(attempt.started_at),
        finishedAt=iso(attempt.finished_at),
        durationMs=attempt.duration_ms,
        exitCode=attempt.exit_code,
        error=attempt.error,
        usage=tokens_dict(row_usage(attempt)),
    )


def step_to_dict(step: WorkflowStepRun) -> StepDict:
    """Needs `step.attempts` prefetched, oldest first (api_selectors.work_item_detail)."""
    attempts = list(step.attempts.all())
    return StepDict(
        id=step.id,
        stepId=step.step_id,
        sequence=step.sequence,
        status=step.status,
        accountProfile=step.account_profile,
        accountTool=step.account_tool,
        startedAt=iso(step.started_at),
        finishedAt=iso(step.finished_at),
        exitCode=step.exit_code,
        durationMs=step.duration_ms,
        error=step.error,
        processesEnded=step.processes_ended,
        egressRefused=step.egress_refused,
        attempts=[attempt_to_dict(a) for a in attempts],
        attemptsText=attempts_story(step.step_id, attempts),
        usage=tokens_dict(step_usage(step, attempts)),
        commitSha=step.commit_sha,
        verdict=step.verdict,
        verdictText=step.verdict_text,
    )


def with_attempts(runs: Iterable[WorkflowRun]) -> Iterator[tuple[WorkflowRun, int]]:
    """Each of `runs` (an item's, oldest first) with its attempt: its number among them. A
    loop-level retry and a re-admission (requeue, an operator's retry: a new loop) are each
    the next attempt, so an item admitted twice never shows two runs as "attempt 1"."""
    for number, run in enumerate(runs, start=1):
        yield run, number


def run_to_dict(run: WorkflowRun, *, attempt: int | None = None) -> RunDict:
    steps = [step_to_dict(s) for s in run.step_runs.all()]
    return RunDict(
        id=run.id,
        workflowName=run.workflow_name,
        status=run.status,
        attempt=attempt,
        loopId=run.loop_id,
        scheduledFor=iso(run.scheduled_for),
        createdAt=iso(run.created_at),
        startedAt=iso(run.started_at),
        finishedAt=iso(run.finished_at),
        durationMs=run.duration_ms,
        error=run.error,
        worktreePath=run.worktree_path,
        branch=run.worktree_branch,
        commitHead=run.commit_head,
        workNotCommitted=run.commit_error,
        **delivery_fields(run),  # type: ignore[typeddict-item]
        steps=steps,
        usage=tokens_dict(run_usage(run)),
    )


def run_usage(run: WorkflowRun) -> UsageSum:
    """Tokens and cost of a run's steps (their prefetched attempts)."""
    return sum(
        (step_usage(s, list(s.attempts.all())) for s in run.step_runs.all()),
        UsageSum(),
    )


def inbox_ref_to_dict(event: InboxEvent) -> InboxRefDict:
    return InboxRefDict(
        id=event.id,
        source=event.source,
        eventId=event.event_id,
        type=event.event_type,
        state=event.state,
        receivedAt=iso(event.received_at),
    )


def work_item_detail_to_dict(item: WorkflowWorkItem) -> WorkItemDetailDict:
    """Needs `api_selectors.work_item_detail`'s prefetches (else one query per relation row).

    Runs come oldest first; each is numbered among the runs of its loop (its attempt)."""
    return WorkItemDetailDict(
        **work_item_summary(item),
        deferrals=[deferral_to_dict(d) for d in item.deferrals.all()],
        runs=[run_to_dict(run, attempt=n) for run, n in with_attempts(item.runs.all())],
        inboxEvents=[inbox_ref_to_dict(e) for e in item.inbox_events.all()],
        usage=tokens_dict(sum((run_usage(r) for r in item.runs.all()), UsageSum())),
        prReviewRouting=_pr_review_routing(item),
        revisions=item_rounds(item.id),
    )


def _pr_review_routing(item: WorkflowWorkItem) -> dict[str, Any] | None:
    scope = item.invocation.scope_json if item.invocation_id else None
    routing = scope.get("prReviewRouting") if isinstance(scope, dict) else None
    return routing if isinstance(routing, dict) else None


# --- drains -----------------------------------------------------------------------------------


class DrainDict(TypedDict):
    id: str
    kind: str
    name: str | None
    routeScope: str | None
    source: str
    dryRun: bool
    startedAt: str | None
    finishedAt: str | None
    durationMs: int | None
    scanned: int
    candidates: int
    considered: int
    created: int
    deduped: int
    throttled: int
    skipped: int
    fatal: int
    # Of the skipped, review tasks whose PR was merged or closed (docs/delivery.md §6).
    freshnessClosed: int
    error: str | None
    heldReason: str | None


class DrainDetailDict(DrainDict):
    options: Any
    results: Any
    evidencePath: str | None


def drain_to_dict(drain: DrainRecord) -> DrainDict:
    return DrainDict(
        id=drain.id,
        kind=drain.kind,
        name=drain.name,
        routeScope=drain.route_scope,
        source=drain.source,
        dryRun=drain.dry_run,
        startedAt=iso(drain.started_at),
        finishedAt=iso(drain.finished_at),
        durationMs=drain.duration_ms,
        scanned=drain.scanned,
        candidates=drain.candidates,
        considered=drain.considered,
        created=drain.created,
        deduped=drain.deduped,
        throttled=drain.throttled,
        skipped=drain.skipped,
        fatal=drain.fatal,
        freshnessClosed=drain.freshness_closed,
        error=drain.error,
        heldReason=drain.held_reason,
    )


def drain_detail_to_dict(drain: DrainRecord) -> DrainDetailDict:
    return DrainDetailDict(
        **drain_to_dict(drain),
        options=drain.options_json,
        results=drain.results_json,
        evidencePath=drain.evidence_path,
    )


# --- accounts ---------------------------------------------------------------------------------


class CooldownDict(TypedDict):
    until: str | None
    remainingSeconds: int
    reason: str | None
    reports: int


class AccountDict(TypedDict):
    profile: str
    tool: str | None
    running: int
    reserved: int
    load: int
    # --max-per-profile that applies (the strictest drain configuration naming the account)
    maxPerProfile: int | None
    atCap: bool
    cooldown: CooldownDict | None
    # The account registry: None for an unregistered name.
    registry: RegistryDict | None
    # Token usage reported by the agents over the last 5 hours and 7 days.
    usage5h: UsageDict | None
    usage7d: UsageDict | None
    # Its rate-limit windows (docs/windows.md): window, used, status, resetsAt, source,
    # observedAt, spend (None here: admission reads it); and `at window` / `near window` /
    # None.
    windows: list[dict[str, Any]]
    windowMark: str | None


class RegistryDict(TypedDict):
    provider: str
    enabled: bool
    maxRunning: int | None
    env: dict[str, str]
    # A step's login was refused (ledger 0014): when, and the agent's words; None: no mark.
    loginFailedAt: str | None
    loginFailedReason: str | None


class UsageDict(TypedDict):
    steps: int
    inputTokens: int
    outputTokens: int
    cachedTokens: int
    costUsd: float | None


def _usage_dict(usage: UsageTotals | None) -> UsageDict | None:
    if usage is None:
        return None
    return UsageDict(
        steps=usage.steps,
        inputTokens=usage.input_tokens,
        outputTokens=usage.output_tokens,
        cachedTokens=usage.cached_tokens,
        costUsd=usage.cost_usd,
    )


def account_to_dict(row: AccountRow, *, now: datetime) -> AccountDict:
    cooldown: CooldownDict | None = None
    if row.cooldown is not None and row.cooling(now):
        cooldown = CooldownDict(
            until=iso(row.cooldown.until),
            remainingSeconds=max(0, int((row.cooldown.until - now).total_seconds())),
            reason=row.cooldown.reason,
            reports=row.cooldown.reports,
        )
    return AccountDict(
        profile=row.profile,
        tool=row.tool,
        running=row.running,
        reserved=row.reserved,
        load=row.load,
        maxPerProfile=row.cap.limit if row.cap else None,
        atCap=row.at_cap,
        cooldown=cooldown,
        registry=RegistryDict(
            provider=row.registered.provider,
            enabled=row.registered.enabled,
            maxRunning=row.registered.max_running,
            env=dict(row.registered.env),
            loginFailedAt=iso(row.registered.login_failed_at),
            loginFailedReason=row.registered.login_failed_reason,
        )
        if row.registered is not None
        else None,
        usage5h=_usage_dict(row.usage_5h),
        usage7d=_usage_dict(row.usage_7d),
        windows=[w.to_dict() for w in row.windows],
        windowMark=row.window_mark,
    )
