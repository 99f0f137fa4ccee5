"""Drains: take open work from a source and route it through admission (reference §5).

`drain_run` is shared by the `drain` command and the django-q2 task `routing.tasks.drain`:
0. One drain per (route, scope) at a time (upstream's overlap `skip`): a drain that finds
   another of its scope running returns at once, writing nothing (`overlapSkipped`). A drain
   whose scope is already at --max-active scans nothing (`heldReason`).
1. Scan the source (inbox or an external command), apply the post-filters (tags, project
   path prefix), and order candidates fairly: round-robin across projects, oldest first within
   a project (upstream takes source order and lets one busy project starve the rest). The
   inbox scan keeps light rows; envelopes are loaded for the `limit` candidates only.
2. For each candidate, until `max_dispatch` results are `created`: pre-check the caps with an
   unlocked read and hold back (reported as throttled with `precheck: true`; the inbox row
   becomes `deferred` with the reason and code) items whose scope, project, group or account
   pool is already full, without spending an admission on them; otherwise route it through
   `route_event`, which decides again under the admission lock. Only `created` counts toward
   max_dispatch. An error on one item is recorded as `fatal` and the batch continues. Once
   the scope (or a pool every candidate shares) is full, the rest are held unread, and a
   full project or group holds its later candidates without another count.
3. Store a drain record (options, scope, timing, counts, compact results) and, with
   `evidence_dir`, write the full report as a private JSON file.

A dry run executes the same steps inside one transaction that is rolled back at the end, so
later candidates see earlier would-be admissions exactly as in a real drain, and nothing is
written (no drain record unless `record_dry_run`).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import F
from django.utils import timezone

from ledger.models import KEEP_WORK_ITEM_STATUSES, WorkflowWorkItem
from ledger.selectors import active_counts
from routing.domain import reasons
from routing.domain.errors import ApplicationError, ValidationError
from routing.domain.keys import route_key_for_kind
from routing.domain.scope import LOOP_NAME_ENV, resolve_route_scope
from routing.domain.throttle import ThrottleCounts, admission_decision, parse_limit
from routing.lock import admission_lock, drain_lock
from routing.models import OPEN_INBOX_STATES, DrainRecord, InboxEvent, InboxState
from routing.services import (
    CREATED,
    DEDUPED,
    SKIPPED,
    THROTTLED,
    RouteOptions,
    RoutePlan,
    RouteResult,
    normalize_project_path,
    plan_route,
    pool_assignment_now,
    route_event,
    route_options,
)
from routing.sources import (
    COMMAND_SOURCE,
    INBOX_SOURCE,
    Candidate,
    load_envelopes,
    run_source_command,
    scan_command,
    scan_inbox,
)

DRAIN_OPTION_NAMES = (
    "max_dispatch",
    "limit",
    "scan_limit",
    "tags",
    "project_path_prefix",
    "source",
    "source_command",
    "source_timeout",
    "evidence_dir",
    "compact",
    "record_dry_run",
)


@dataclass(frozen=True)
class DrainOptions:
    kind: str
    route: RouteOptions = field(default_factory=RouteOptions)
    max_dispatch: int = 1
    limit: int = 50
    scan_limit: int | None = None
    tags: tuple[str, ...] = ()
    project_path_prefix: str | None = None
    source: str = INBOX_SOURCE
    source_command: str | None = None
    source_timeout: int = 60
    evidence_dir: str | None = None
    compact: bool = False
    record_dry_run: bool = False
    name: str | None = None

    @property
    def filters_applied(self) -> bool:
        return bool(self.tags or self.project_path_prefix)

    @property
    def effective_scan_limit(self) -> int:
        # Upstream: max(limit, 500) when post-filters apply, else limit. Fair dispatch needs to
        # see past the first project's backlog, so the inbox always scans a wider window.
        if self.scan_limit is not None:
            return self.scan_limit
        return (
            max(self.limit, 500)
            if (self.filters_applied or self.source == INBOX_SOURCE)
            else self.limit
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, **self.route.to_dict()}
        for name in DRAIN_OPTION_NAMES:
            value = getattr(self, name)
            if name == "tags":
                value = ",".join(value) if value else None
            if value not in (None, False, "", ()):
                out[name] = value
        return out


def _positive(flag: str, value: Any, default: int) -> int:
    parsed = parse_limit(flag, value)
    return default if parsed is None else parsed


def drain_options(
    kind: str, raw: Mapping[str, Any], *, name: str | None = None
) -> DrainOptions:
    """Validate drain options from argv, a schedule's kwargs or an API body."""
    route_key_for_kind(kind)
    drain_raw = {k: raw[k] for k in DRAIN_OPTION_NAMES if raw.get(k) is not None}
    route_raw = {
        k: v
        for k, v in raw.items()
        if k not in DRAIN_OPTION_NAMES and k != "kind" and v is not None
    }
    source = drain_raw.get("source") or INBOX_SOURCE
    if source not in (INBOX_SOURCE, COMMAND_SOURCE):
        raise ValidationError("--source must be inbox or command")
    command = drain_raw.get("source_command")
    if source == COMMAND_SOURCE and not command:
        raise ValidationError("--source command needs --source-command")
    tags = drain_raw.get("tags") or ()
    if isinstance(tags, str):
        tags = tuple(t.strip() for t in tags.split(",") if t.strip())
    scan_limit = parse_limit("--scan-limit", drain_raw.get("scan_limit"))
    prefix = drain_raw.get("project_path_prefix")
    return DrainOptions(
        kind=kind,
        route=route_options(route_raw),
        max_dispatch=_positive("--max-dispatch", drain_raw.get("max_dispatch"), 1),
        limit=_positive("--limit", drain_raw.get("limit"), 50),
        scan_limit=scan_limit,
        tags=tuple(tags),
        project_path_prefix=prefix.strip()
        if isinstance(prefix, str) and prefix.strip()
        else None,
        source=source,
        source_command=command,
        source_timeout=_positive(
            "--source-timeout", drain_raw.get("source_timeout"), 60
        ),
        evidence_dir=drain_raw.get("evidence_dir") or None,
        compact=bool(drain_raw.get("compact")),
        record_dry_run=bool(drain_raw.get("record_dry_run")),
        name=name,
    )


# --- fair ordering and filters ----------------------------------------------------------------


def fair_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Round-robin across projects (in order of each project's oldest candidate), oldest
    first within a project."""
    queues: OrderedDict[str, list[Candidate]] = OrderedDict()
    for candidate in candidates:
        queues.setdefault(candidate.project, []).append(candidate)
    ordered: list[Candidate] = []
    depth = 0
    while True:
        layer = [queue[depth] for queue in queues.values() if depth < len(queue)]
        if not layer:
            return ordered
        ordered.extend(layer)
        depth += 1


def _under(path: str, prefix: str) -> bool:
    path, prefix = path.rstrip("/") or "/", prefix.rstrip("/") or "/"
    return path == prefix or path.startswith(prefix if prefix == "/" else prefix + "/")


def _passes_filters(candidate: Candidate, options: DrainOptions, cwd: str) -> bool:
    if options.tags and not set(options.tags) <= set(candidate.tags):
        return False
    if options.project_path_prefix:
        if not candidate.project:
            return False
        prefix = normalize_project_path(options.project_path_prefix, cwd=cwd)
        if not _under(normalize_project_path(candidate.project, cwd=cwd), prefix):
            return False
    return True


# --- the drain --------------------------------------------------------------------------------


@dataclass
class DrainReport:
    options: DrainOptions
    route_key: str
    route_scope: str
    started_at: datetime
    dry_run: bool
    scanned: int = 0
    candidates: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: {
            "considered": 0,
            CREATED: 0,
            DEDUPED: 0,
            THROTTLED: 0,
            SKIPPED: 0,
            "fatal": 0,
        }
    )
    duration_ms: int = 0
    evidence_path: str | None = None
    record_id: str | None = None
    error: str | None = None
    # Set when the scope (or a pool every candidate shares) was full: at the start (nothing
    # scanned) or part-way (the rest held unread).
    held_reason: str | None = None
    # Another drain of the same scope was running: this one did nothing (overlap `skip`).
    overlapped: bool = False

    @property
    def fatal(self) -> int:
        return self.counts["fatal"]

    def compact_results(self) -> list[dict[str, Any]]:
        return [compact_result(r) for r in self.results]

    def to_dict(self, *, compact: bool) -> dict[str, Any]:
        return {
            "drainId": self.record_id,
            "drainedAt": self.started_at.isoformat().replace("+00:00", "Z"),
            "kind": self.options.kind,
            "routeKey": self.route_key,
            "routeScope": self.route_scope,
            "name": self.options.name,
            "source": self.options.source,
            "templateId": self.options.route.template,
            "tags": list(self.options.tags),
            "projectPathPrefix": self.options.project_path_prefix,
            "limit": self.options.limit,
            "scanLimit": self.options.effective_scan_limit,
            "filtersApplied": self.options.filters_applied,
            "scanned": self.scanned,
            "candidates": self.candidates,
            "scanExhausted": self.scanned >= self.options.effective_scan_limit,
            "considered": self.counts["considered"],
            "created": self.counts[CREATED],
            "deduped": self.counts[DEDUPED],
            "throttled": self.counts[THROTTLED],
            "skipped": self.counts[SKIPPED],
            "fatal": self.counts["fatal"],
            "maxDispatch": self.options.max_dispatch,
            "dryRun": self.dry_run,
            "durationMs": self.duration_ms,
            "error": self.error,
            "heldReason": self.held_reason,
            "overlapSkipped": self.overlapped,
            "results": self.compact_results() if compact else self.results,
            "evidencePath": self.evidence_path,
        }

    def human(self) -> str:
        if self.overlapped:
            return (
                f"drain skipped: another {self.route_key} drain of scope "
                f"{self.route_scope} is running (overlap skip)"
            )
        c = self.counts
        prefix = "dry-run " if self.dry_run else ""
        return (
            f"{prefix}drained {self.options.source} queue ({self.route_key}, scope {self.route_scope}): "
            f"considered={c['considered']} created={c[CREATED]} deduped={c[DEDUPED]} "
            f"throttled={c[THROTTLED]} skipped={c[SKIPPED]} fatal={c['fatal']}"
            + (f" (held: {self.held_reason})" if self.held_reason else "")
        )


COMPACT_FIELDS = (
    "kind",
    "taskId",
    "eventId",
    "idempotencyKey",
    "reason",
    "reasonCode",
    "workItemId",
    "workItemStatus",
    "loopId",
    "loopName",
    "workflowId",
    "workflowName",
    "accountProfiles",
    "routeScope",
    "requeue",
    "precheck",
    "fatal",
)


def compact_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """The §5.3 compact fields of one full result."""
    item = result.get("workItem") or {}
    flat = {
        "kind": result.get("kind"),
        "taskId": result.get("taskId") or (result.get("event") or {}).get("subject"),
        "eventId": (result.get("event") or {}).get("id"),
        "idempotencyKey": result.get("idempotencyKey"),
        "reason": result.get("reason"),
        "reasonCode": result.get("reasonCode"),
        "workItemId": item.get("id"),
        "workItemStatus": item.get("status"),
        "loopId": (result.get("loop") or {}).get("id"),
        "loopName": (result.get("loop") or {}).get("name"),
        "workflowId": (result.get("workflow") or {}).get("id"),
        "workflowName": (result.get("workflow") or {}).get("name"),
        "accountProfiles": result.get("accountProfiles"),
        "routeScope": result.get("routeScope"),
        "requeue": result.get("requeue"),
        "precheck": result.get("precheck"),
        "fatal": result.get("fatal"),
    }
    return {k: v for k, v in flat.items() if v is not None}


def _precheck(plan: RoutePlan, now: datetime) -> tuple[str, str] | None:
    """(reason, code) when this item's caps are already full (unlocked read), else None."""
    if plan.limits.any_set:
        seen = active_counts(
            scope=plan.scope,
            project_key=plan.project_path,
            project_group=plan.project_group,
        )
        decision = admission_decision(
            scope=plan.scope,
            project_path=plan.project_path,
            project_group=plan.project_group,
            counts=ThrottleCounts(
                scope=seen.scope, project=seen.project, project_group=seen.project_group
            ),
            limits=plan.limits,
        )
        if not decision.allowed:
            return decision.reason or "", decision.reason_code or reasons.ROUTE_CAP
    if plan.pool_active:
        view = pool_assignment_now(plan, now)
        if view.assignment.deferred:  # the reason admission would give
            return (
                view.deferral_reason,
                view.assignment.reason_code or reasons.PROFILE_CAP,
            )
    return None


def _claim(candidate: Candidate, **record: Any) -> bool:
    """Take an inbox row for this drain: a conditional update, so it works on both databases.

    Concurrent drains scan the same oldest rows; without a claim they would all route the
    same events and spend their time on dedupes. Losing the claim means another drain took
    the row since the scan: this one skips it. `record` (state, reason, ...) settles the row
    in the same statement, for an item that is held or skipped without an admission.
    """
    return bool(
        InboxEvent.objects.filter(
            pk=candidate.inbox_id,
            state__in=OPEN_INBOX_STATES,
            route_attempts=candidate.route_attempts,
        ).update(route_attempts=F("route_attempts") + 1, **record)
    )


def _hold_record(result: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The inbox columns for an item held by a pre-check, skipped, or failed."""
    state = InboxState.DEFERRED
    if result.get("fatal"):
        state = InboxState.FAILED
    elif result["kind"] == SKIPPED:
        state = InboxState.SKIPPED
    return {
        "state": state,
        "last_reason": result.get("reason"),
        "reason_code": result.get("reasonCode"),
        "routed_at": now,
        "updated_at": now,
    }


@dataclass
class _Full:
    """Caps this drain has seen full (reason, code), to hold later candidates without reads.

    - `every`: the scope, or a pool that every candidate shares (--auth-profile-pool), is
      full: every later candidate is held unread (not even planned), and their rows are
      written with one UPDATE at the end of the drain.
    - `keys`: a full project or group holds its later candidates without a count.
    """

    every: tuple[str, str] | None = None
    keys: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    held_rows: list[str] = field(default_factory=list)

    def held(self, plan: RoutePlan) -> tuple[str, str] | None:
        for key in (("project", plan.project_path), ("group", plan.project_group)):
            if key in self.keys:
                return self.keys[key]
        return None

    def saw(
        self, plan: RoutePlan, reason: str, code: str, *, shared_pool: bool
    ) -> None:
        if code == reasons.ROUTE_CAP or (
            shared_pool and code in (reasons.PROFILE_CAP, reasons.COOLDOWN)
        ):
            self.every = (reason, code)
        elif code == reasons.PROJECT_CAP and plan.project_path:
            self.keys[("project", plan.project_path)] = (reason, code)
        elif code == reasons.GROUP_CAP and plan.project_group:
            self.keys[("group", plan.project_group)] = (reason, code)

    def record_held_rows(self, now: datetime) -> None:
        """One UPDATE for the rows held because everything was full (still open ones only:
        a row another drain routed meanwhile keeps its outcome)."""
        if self.held_rows and self.every is not None:
            reason, code = self.every
            InboxEvent.objects.filter(
                pk__in=self.held_rows, state__in=OPEN_INBOX_STATES
            ).update(
                **_hold_record(
                    {"kind": THROTTLED, "reason": reason, "reasonCode": code}, now
                )
            )


def _held(
    envelope: Any, reason: str, code: str, plan: RoutePlan | None = None
) -> dict[str, Any]:
    """A pre-check hold; without `plan` (held unread, everything full) no key is known."""
    result: dict[str, Any] = {
        "kind": THROTTLED,
        "precheck": True,
        "reason": reason,
        "reasonCode": code,
        "event": {"id": envelope.id, "type": envelope.type, "source": envelope.source},
    }
    if plan is not None:
        result.update(idempotencyKey=plan.idempotency_key, taskId=plan.task_id)
    return result


def _scope_full(report: DrainReport, options: DrainOptions) -> tuple[str, str] | None:
    """(reason, code) when the drain's scope is at --max-active before it scans anything."""
    if options.route.limits.max_active is None:
        return None
    seen = active_counts(scope=report.route_scope, project_key=None, project_group=None)
    decision = admission_decision(
        scope=report.route_scope,
        project_path=None,
        project_group=None,
        counts=ThrottleCounts(scope=seen.scope, project=0, project_group=None),
        limits=options.route.limits,
    )
    if decision.allowed:
        return None
    return decision.reason or "", decision.reason_code or reasons.ROUTE_CAP


def _route_one(
    candidate: Candidate,
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    now: datetime,
    dry_run: bool,
    full: _Full,
) -> dict[str, Any] | None:
    """The result of routing one candidate; None when another drain claimed it first.

    Writes (not in a dry run): one conditional UPDATE for an item skipped, or held by the
    pre-check (none when its row already records that hold); otherwise one transaction under
    the admission lock: the claim, the admission and the row's outcome.
    """
    envelope = candidate.envelope
    assert envelope is not None, "load_envelopes() before routing"
    settle = bool(candidate.inbox_id) and not dry_run
    route = replace(
        options.route, dry_run=False
    )  # a dry drain rolls back its outer transaction
    plan = plan_route(
        kind=options.kind, envelope=envelope, options=route, env=env, cwd=cwd
    )
    if isinstance(plan, RouteResult):  # skipped by eligibility
        result = plan.to_dict()
        if settle and not _claim(candidate, **_hold_record(result, now)):
            return None
        return result
    already_routed = WorkflowWorkItem.objects.filter(
        route_key=plan.route_key,
        idempotency_key=plan.idempotency_key,
        status__in=KEEP_WORK_ITEM_STATUSES,
    ).exists()
    # Items that already ran or run are deduped by admission, never held by a pre-check.
    held = None
    if not already_routed:
        held = full.held(plan) or _precheck(plan, now)
    shared_pool = bool(options.route.auth_profile_pool)
    if held is not None:
        full.saw(plan, *held, shared_pool=shared_pool)
        result = _held(envelope, *held, plan=plan)
        if (
            settle
            and not candidate.recorded_as(InboxState.DEFERRED, held[1], held[0])
            and not _claim(candidate, **_hold_record(result, now))
        ):
            return None
        return result
    with transaction.atomic():
        if settle:
            # The admission lock first: every writer of inbox rows and work items that could
            # meet this one (an API delivery, an operator's requeue) takes it first too, so
            # locking the row before the work item cannot deadlock. A lost claim costs one
            # statement, not an admission.
            admission_lock()
            if not _claim(candidate):
                return None
        routed = route_event(
            kind=options.kind,
            envelope=envelope,
            options=route,
            env=env,
            cwd=cwd,
            now=now,
        )
        if settle:
            inbox_record_route(candidate.inbox_id, routed, now)
    if routed.kind == THROTTLED and routed.reason_code:  # lost a race under the lock
        full.saw(plan, routed.reason or "", routed.reason_code, shared_pool=shared_pool)
    routed.dry_run = dry_run
    return routed.to_dict()


_INBOX_STATE = {
    CREATED: InboxState.ADMITTED,
    DEDUPED: InboxState.ADMITTED,
    THROTTLED: InboxState.DEFERRED,
    SKIPPED: InboxState.SKIPPED,
}


def inbox_record_route(inbox_id: str, result: RouteResult, now: datetime) -> None:
    InboxEvent.objects.filter(pk=inbox_id).update(
        state=_INBOX_STATE[result.kind],
        work_item=result.work_item,
        last_reason=result.reason
        or (result.work_item.last_reason if result.work_item else None),
        reason_code=result.reason_code,
        routed_at=now,
        updated_at=now,
    )


def _record_failure(
    candidate: Candidate, result: Mapping[str, Any], now: datetime
) -> None:
    """Mark the row failed, unless another drain took it since the scan (a failed attempt's
    own claim rolled back with it)."""
    if candidate.inbox_id:
        _claim(candidate, **_hold_record(result, now))


def inbox_record_hold(
    inbox_id: str | None, result: Mapping[str, Any], now: datetime
) -> None:
    """Record a failed or held item on its inbox row (no admission happened)."""
    if inbox_id:
        InboxEvent.objects.filter(pk=inbox_id).update(**_hold_record(result, now))


def _write_evidence(
    directory: str, route_key: str, started_at: datetime, report: dict[str, Any]
) -> str:
    """Write the full report privately: directory 0700, file 0600, never overwriting."""
    path = Path(directory)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    stamp = (
        started_at.strftime("%Y%m%dT%H%M%S") + f"{started_at.microsecond // 1000:03d}Z"
    )
    while True:
        target = path / f"{route_key}-drain-{stamp}-{uuid.uuid4().hex[:8]}.json"
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        break
    report = {**report, "evidencePath": str(target)}
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return str(target)


def drain_run(
    *,
    options: DrainOptions,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    now: datetime | None = None,
    progress: Any = None,
) -> DrainReport:
    """Run one drain (see the module docstring). Never raises for one bad item; raises
    ApplicationError only when the source itself cannot be read (recorded as the drain's error)."""
    environ = dict(os.environ if env is None else env)
    if options.name:
        environ[LOOP_NAME_ENV] = options.name  # a scheduled drain's scope is its name
    cwd = cwd or os.getcwd()
    dry_run = options.route.dry_run
    route_key = route_key_for_kind(options.kind)
    started = now or timezone.now()
    clock = time.monotonic()
    report = DrainReport(
        options=options,
        route_key=route_key,
        route_scope=resolve_route_scope(
            explicit=options.route.max_active_scope, env=environ, route_key=route_key
        ),
        started_at=started,
        dry_run=dry_run,
    )
    if dry_run:  # reads only: no need to keep other drains out
        return _execute(report, environ, cwd, progress, clock)
    with drain_lock(route_key, report.route_scope) as ours:
        if ours:
            return _execute(report, environ, cwd, progress, clock)
    report.overlapped = True
    report.duration_ms = int((time.monotonic() - clock) * 1000)
    return report


def _execute(
    report: DrainReport,
    env: Mapping[str, str],
    cwd: str,
    progress: Any,
    clock: float,
) -> DrainReport:
    options = report.options
    try:
        if report.dry_run:
            try:
                with transaction.atomic():
                    _drain_loop(report, options, env, cwd, progress)
                    raise _RollBack
            except _RollBack:
                pass
        else:
            _drain_loop(report, options, env, cwd, progress)
    except ApplicationError as exc:
        report.error = str(exc)
        report.counts["fatal"] += 1
    report.duration_ms = int((time.monotonic() - clock) * 1000)
    if options.evidence_dir:
        report.evidence_path = _write_evidence(
            options.evidence_dir,
            report.route_key,
            report.started_at,
            report.to_dict(compact=False),
        )
    if not report.dry_run or options.record_dry_run:
        report.record_id = _record(report).id
    return report


class _RollBack(Exception):
    pass


def _drain_loop(
    report: DrainReport,
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    progress: Any,
) -> None:
    full_scope = _scope_full(report, options)
    if full_scope is not None:  # no scan, no source command: nothing could be admitted
        report.held_reason = full_scope[0]
        return
    scan_limit = options.effective_scan_limit
    if options.source == COMMAND_SOURCE:
        tasks = run_source_command(
            options.source_command or "",
            timeout=options.source_timeout,
            max_bytes=settings.LOOPSWEB_SOURCE_MAX_BYTES,
            cwd=cwd,
        )
        scanned: Iterable[Candidate | ApplicationError] = scan_command(
            route_key=report.route_key, tasks=tasks, scan_limit=scan_limit
        )
    else:
        scanned = scan_inbox(
            route_key=report.route_key,
            scan_limit=scan_limit,
            with_tags=bool(options.tags),
        )

    filtered: list[Candidate] = []
    for entry in scanned:
        report.scanned += 1
        if isinstance(entry, ApplicationError):
            _count(report, {"kind": SKIPPED, "fatal": True, "reason": str(entry)})
            continue
        if _passes_filters(entry, options, cwd):
            filtered.append(entry)
    report.candidates = len(filtered)
    chosen = load_envelopes(fair_order(filtered)[: options.limit])
    del filtered  # only the chosen ones carry payloads; let the scan go
    full = _Full()
    for candidate in chosen:
        if report.counts[CREATED] >= options.max_dispatch:
            break
        now = timezone.now()
        try:
            if full.every is not None:  # nothing more can be admitted in this drain
                result = _hold_unread(candidate, full, report)
            else:
                result = _route_one(
                    candidate, options, env, cwd, now, report.dry_run, full
                )
        except Exception as exc:  # one bad item never stops the batch (§5.2.3)
            envelope = candidate.envelope
            assert envelope is not None
            result = {
                "kind": SKIPPED,
                "fatal": True,
                "reason": f"{type(exc).__name__}: {exc}"[:640],
                "event": {"id": envelope.id, "type": envelope.type},
            }
            if isinstance(exc, OperationalError):
                # Passing (a deadlock, a locked database, a dropped connection): the row
                # stays open for a later drain; the drain still reports it as fatal.
                result["reason"] += " (left open for a later drain)"
            elif not report.dry_run:
                _record_failure(candidate, result, now)
        if result is None:  # claimed by a concurrent drain
            continue
        _count(report, result)
        if progress:
            progress(report)
    full.record_held_rows(timezone.now())


def _hold_unread(
    candidate: Candidate, full: _Full, report: DrainReport
) -> dict[str, Any]:
    """Hold a candidate once the scope (or the shared pool) is full: no read, and its row is
    written with the others at the end (unless it already records this very hold)."""
    assert full.every is not None and candidate.envelope is not None
    reason, code = full.every
    report.held_reason = reason
    if (
        candidate.inbox_id
        and not report.dry_run
        and not candidate.recorded_as(InboxState.DEFERRED, code, reason)
    ):
        full.held_rows.append(candidate.inbox_id)
    return _held(candidate.envelope, reason, code)


def _count(report: DrainReport, result: dict[str, Any]) -> None:
    report.results.append(result)
    report.counts["considered"] += 1
    if result.get("fatal"):
        report.counts["fatal"] += 1
    report.counts[result["kind"]] += 1


def _record(report: DrainReport) -> DrainRecord:
    c = report.counts
    return DrainRecord.objects.create(
        kind=report.route_key,
        name=report.options.name,
        route_scope=report.route_scope,
        source=report.options.source,
        dry_run=report.dry_run,
        options_json=report.options.to_dict(),
        started_at=report.started_at,
        finished_at=timezone.now(),
        duration_ms=report.duration_ms,
        scanned=report.scanned,
        candidates=report.candidates,
        considered=c["considered"],
        created=c[CREATED],
        deduped=c[DEDUPED],
        throttled=c[THROTTLED],
        skipped=c[SKIPPED],
        fatal=c["fatal"],
        results_json=report.compact_results(),
        evidence_path=report.evidence_path,
        error=report.error,
        held_reason=report.held_reason,
    )
