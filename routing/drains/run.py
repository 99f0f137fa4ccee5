"""Drains: take open work from a source and route it through admission (docs/upstream.md §5).

`drain_run` is shared by the `drain` command and the django-q2 task `routing.tasks.drain`:
0. One drain per (route, scope) at a time (upstream's overlap `skip`): a drain that finds
   another of its scope running returns at once, writing nothing (`overlapSkipped`). A drain
   whose scope is already at --max-active scans nothing (`heldReason`).
1. Scan the source (inbox or an external command), apply the post-filters (tags, project
   path prefix), and order candidates fairly: round-robin across projects, oldest first within
   a project (upstream takes source order and lets one busy project starve the rest). The
   inbox scan keeps light rows; envelopes are loaded for the `limit` candidates only.
2. For each candidate, until `max_dispatch` results are `created`: hold back (reported as
   throttled with `precheck: true`; the inbox row becomes `deferred` with the reason and
   code) items whose scope, project, group or account pool is already full, without
   spending an admission on them; otherwise admit it. Both in one pass under the admission
   lock (`routing.admission.admit`: the lookup, the counts and the pool read once, the inbox
   row claimed and recorded in one UPDATE). Items that ran or run are never held: admission
   dedupes them. Only `created` counts toward max_dispatch. An error on one item is
   recorded as `fatal` and the batch continues. Once the scope (or a pool every candidate
   shares) is full, the rest are held unread, and a full project or group holds its later
   candidates without another count. By default candidates are decided in batches
   (`routing.drains.inbox_batch`), with the same decisions; one at a time after a failed batch,
   with LOOPSWEB_DRAIN_BATCH_SIZE=1, and in dry runs.
3. Store a drain record (options, scope, timing, counts, compact results) and, with
   `evidence_dir`, write the full report as a private JSON file.

A dry run executes the same steps inside one transaction that is rolled back at the end, so
later candidates see earlier would-be admissions exactly as in a real drain, and nothing is
written (no drain record unless `record_dry_run`).

The results of candidates held or failed, and the rows held unread, are built in
routing.drains.candidate_results.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from domain.errors import ApplicationError
from domain.keys import TODOS_TASK, route_key_for_kind
from domain.scope import LOOP_NAME_ENV, resolve_route_scope
from ledger.lock import admission_lock, drain_lock
from ledger.models import KEEP_WORK_ITEM_STATUSES, WorkflowWorkItem
from routing.admission import (
    CREATED,
    SKIPPED,
    THROTTLED,
    Hold,
    PlanReads,
    RoutePlan,
    RouteResult,
    admit,
    hand_over,
    plan_reads,
    plan_route,
    projects_check_here,
    scope_hold,
)
from routing.drains.candidate_results import (
    DrainFull,
    candidate_held,
    failed_result,
    held_result,
    hold_unread,
)
from routing.drains.candidates import fair_order, passes_filters
from routing.drains.inbox_batch import route_batch
from routing.drains.options import DrainOptions
from routing.drains.outage import (
    ConnectionLost,
    lost_connection_error,
    record_when_database_back,
    stop_if_connection_lost,
)
from routing.drains.outcomes import (
    hold_record,
    inbox_claim,
    route_record,
)
from routing.drains.record_keeper import RecordKeeper
from routing.drains.report import (
    DrainReport,
    drain_record_save,
    evidence_dir_prepare,
    evidence_write,
    report_count,
)
from routing.drains.sources import (
    COMMAND_SOURCE,
    Candidate,
    load_envelopes,
    run_source_command,
    scan_command,
    scan_inbox,
)
from routing.models import InboxState

logger = logging.getLogger(__name__)

Progress = Callable[[DrainReport], None]
"""Called with the report after each result (the drain command's progress line)."""


def _already_routed(plan: RoutePlan) -> bool:
    """Whether the item ran or runs: admission dedupes it, a hold never applies to it."""
    return WorkflowWorkItem.objects.filter(
        route_key=plan.route_key,
        idempotency_key=plan.idempotency_key,
        status__in=KEEP_WORK_ITEM_STATUSES,
    ).exists()


def _route_one(
    candidate: Candidate,
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    now: datetime,
    dry_run: bool,
    full: DrainFull,
    reads: PlanReads,
) -> dict[str, Any] | None:
    """The result of routing one candidate; None when another drain claimed it first.

    One pass: the plan is made once (here), and one transaction under the admission lock
    (`routing.admission.admit`) looks the item up and reads the counts once, then holds it
    (the caps or its pool are full and it has not run: nothing written but its inbox row,
    unless the row already records that hold) or admits it; the inbox row is claimed and
    records the outcome in one conditional UPDATE at the end (a row another drain took since
    the scan rolls the admission back). Without a transaction: an item skipped (one
    conditional UPDATE), or held because this drain already saw its project or group full
    (one read, and one UPDATE unless the row records that hold).
    """
    envelope = candidate.envelope
    assert envelope is not None, "load_envelopes() before routing"
    settle = bool(candidate.inbox_id) and not dry_run
    plan = plan_route(
        kind=options.kind,
        envelope=envelope,
        options=replace(options.route, dry_run=False),  # a dry drain rolls back itself
        env=env,
        cwd=cwd,
        reads=reads,
    )
    if isinstance(plan, RouteResult):  # skipped by eligibility
        result = plan.to_dict()
        if settle and not inbox_claim(candidate, **hold_record(result, now)):
            return None
        return result
    if not dry_run:
        projects_check_here([plan])
    shared_pool = bool(options.route.auth_profile_pool)
    # Items that already ran or run are deduped by admission, never held.
    held = full.held(plan) if plan.refusal is None else None  # refusals: admission
    if held is not None and not _already_routed(plan):
        return _settle_hold(candidate, plan, held, now, settle)
    with transaction.atomic():  # a savepoint in a dry drain's outer transaction
        # The admission lock first: every writer of inbox rows and work items that could
        # meet this one (an API delivery, an operator's requeue) takes it first too, so the
        # order in which this transaction then writes the item and the row cannot deadlock.
        # A dry drain takes none: its outer transaction, rolled back at the end, would hold
        # it for the whole drain (every candidate's planning and file-system checks
        # included, measured: docs/design.md), and it writes nothing that lasts.
        if not dry_run:
            admission_lock()
        routed = admit(
            plan,
            now=now,
            enqueue=False,
            early_dedupe=plan.route_key == TODOS_TASK,
            hold_when_full=True,
        )
        if isinstance(routed, Hold):
            full.saw(plan, routed, shared_pool=shared_pool)
            return _settle_hold(candidate, plan, routed, now, settle)
        if settle and not inbox_claim(candidate, **route_record(routed, now)):
            transaction.set_rollback(True)  # another drain took the row since the scan
            return None
        if not dry_run:  # a dry drain rolls back: no task for the runner
            hand_over(routed)
    if routed.kind == THROTTLED and routed.reason_code:  # a deferral of a re-admission
        full.saw(
            plan, Hold(routed.reason or "", routed.reason_code), shared_pool=shared_pool
        )
    routed.dry_run = dry_run
    return routed.to_dict()


def _settle_hold(
    candidate: Candidate,
    plan: RoutePlan,
    hold: Hold,
    now: datetime,
    settle: bool,
) -> dict[str, Any] | None:
    """A hold's result; its row records it (one conditional UPDATE, none when the row already
    records this very hold). None when another drain took the row since the scan."""
    assert candidate.envelope is not None
    result = held_result(candidate.envelope, hold, plan)
    if (
        settle
        and not candidate.recorded_as(InboxState.DEFERRED, hold.code, hold.reason)
        and not inbox_claim(candidate, **hold_record(result, now))
    ):
        return None
    return result


def drain_run(
    *,
    options: DrainOptions,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    now: datetime | None = None,
    progress: Progress | None = None,
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
    progress: Progress | None,
    clock: float,
) -> DrainReport:
    options = report.options
    evidence_dir: str | None = None  # once it is ready
    if not report.dry_run:  # its record as it goes (drains.record_keeper)
        progress = RecordKeeper(report).start(progress)
    try:
        if options.evidence_dir:  # refused before anything is admitted (recorded)
            evidence_dir_prepare(options.evidence_dir)
            evidence_dir = options.evidence_dir
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
    except Exception as exc:
        # A lost database connection stops the drain with its report so far (drains.outage).
        lost = lost_connection_error(exc)
        if lost is None:
            raise
        report.error = lost
    report.duration_ms = int((time.monotonic() - clock) * 1000)
    if evidence_dir:
        try:
            report.evidence_path = evidence_write(
                evidence_dir,
                report.route_key,
                report.started_at,
                report.to_dict(compact=False),
            )
        except OSError as exc:  # e.g. the directory vanished during the drain
            report.error = f"evidence file not written: {exc}"
    if not report.dry_run or options.record_dry_run:
        record_when_database_back(report, drain_record_save)
    return report


class _RollBack(Exception):
    pass


def _drain_loop(
    report: DrainReport,
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    progress: Progress | None,
) -> None:
    full_scope = scope_hold(report.route_scope, options.route.limits)
    if full_scope is not None:  # no scan, no source command: nothing could be admitted
        report.held_reason = full_scope.reason
        return
    chosen = _choose(report, options, _scan(report, options, cwd), cwd)
    full = DrainFull()
    reads = plan_reads()  # one read per pass: the hosts, and which pools are registered
    # Batches while they work; after a failed batch, one candidate at a time.
    batching = not report.dry_run and settings.LOOPSWEB_DRAIN_BATCH_SIZE > 1
    index = 0
    while index < len(chosen):
        if report.counts[CREATED] >= options.max_dispatch:
            break
        if batching and full.every is None:
            try:
                done = _route_batch(
                    chosen[index : index + settings.LOOPSWEB_DRAIN_BATCH_SIZE],
                    options,
                    env,
                    cwd,
                    full,
                    report,
                    reads,
                )
            except ConnectionLost:
                raise
            except Exception as exc:  # nothing of the batch was written
                stop_if_connection_lost(exc)
                logger.warning("drain batch failed, routing one at a time: %s", exc)
                batching = False
                continue
            for result in done:
                _report_result(report, result, progress)
            index += len(done)
            continue
        candidate = chosen[index]
        index += 1
        _report_result(
            report,
            _route_next(candidate, options, env, cwd, full, report, reads),
            progress,
        )
    full.record_held_rows(timezone.now())


def _scan(
    report: DrainReport, options: DrainOptions, cwd: str
) -> Iterable[Candidate | ApplicationError]:
    """The drain's source read: the source command's tasks, or the inbox's open rows."""
    scan_limit = options.effective_scan_limit
    if options.source == COMMAND_SOURCE:
        tasks = run_source_command(
            options.source_command or "",
            timeout=options.source_timeout,
            max_bytes=settings.LOOPSWEB_SOURCE_MAX_BYTES,
            cwd=cwd,
        )
        return scan_command(
            route_key=report.route_key, tasks=tasks, scan_limit=scan_limit
        )
    return scan_inbox(
        route_key=report.route_key,
        scan_limit=scan_limit,
        with_tags=bool(options.tags),
    )


def _choose(
    report: DrainReport,
    options: DrainOptions,
    scanned: Iterable[Candidate | ApplicationError],
    cwd: str,
) -> list[Candidate]:
    """The candidates this drain routes, in fair order, with their envelopes: those passing
    the post-filters, up to `limit`. Counts the scan (an unreadable entry is fatal)."""
    filtered: list[Candidate] = []
    for entry in scanned:
        report.scanned += 1
        if isinstance(entry, ApplicationError):
            report_count(report, {"kind": SKIPPED, "fatal": True, "reason": str(entry)})
            continue
        if passes_filters(entry, options, cwd):
            filtered.append(entry)
    report.candidates = len(filtered)
    # Payloads for the chosen ones only; the rest of the scan is let go on return.
    return load_envelopes(fair_order(filtered)[: options.limit])


def _route_next(
    candidate: Candidate,
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    full: DrainFull,
    report: DrainReport,
    reads: PlanReads,
) -> dict[str, Any] | None:
    """One candidate's result, one at a time: held unread once nothing more can be
    admitted, else routed; failed when that raises. None when another drain claimed it."""
    now = timezone.now()
    try:
        if full.every is not None and _may_route(candidate, options, env, cwd, reads):
            # Nothing more can be admitted in this drain. (An event that can never
            # route goes on to _route_one, which reports it skipped, not throttled.)
            return hold_unread(candidate, full, report)
        return _route_one(
            candidate, options, env, cwd, now, report.dry_run, full, reads
        )
    # one bad item never stops the batch (docs/upstream.md §5.2.3)
    except Exception as exc:
        return failed_result(candidate, exc, now, report.dry_run)


def _report_result(
    report: DrainReport, result: dict[str, Any] | None, progress: Progress | None
) -> None:
    """Count a result in the report and show progress; None (a row another drain
    claimed) counts nothing."""
    if result is None:
        return
    report_count(report, result)
    if progress:
        progress(report)


def _route_or_fail(
    candidate: Candidate,
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    full: DrainFull,
    reads: PlanReads,
) -> dict[str, Any] | None:
    now = timezone.now()
    try:
        return _route_one(candidate, options, env, cwd, now, False, full, reads)
    except Exception as exc:
        return failed_result(candidate, exc, now, False)


def _may_route(
    candidate: Candidate,
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    reads: PlanReads,
) -> bool:
    """Whether the candidate's envelope plans at all (no store access): one without the
    opt-in, with a manual gate or without a task id never routes, however free the caps.
    A plan with a refusal goes to admission too (deduped or refused, never held)."""
    assert candidate.envelope is not None
    try:
        plan = plan_route(
            kind=options.kind,
            envelope=candidate.envelope,
            options=options.route,
            env=env,
            cwd=cwd,
            reads=PlanReads(reads.hosts),  # eligibility only: no account registry
        )
    except ApplicationError:
        return False
    return not isinstance(plan, RouteResult) and plan.refusal is None


_Slot = int | RouteResult | Exception
"""A batch candidate's plan: its index among the planned pairs, its skip, or its failure."""


def _route_batch(
    candidates: list[Candidate],
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    full: DrainFull,
    report: DrainReport,
    reads: PlanReads,
) -> list[dict[str, Any] | None]:
    """Route `candidates` in order as `_route_one` would, the admissions in one transaction
    (routing.drains.inbox_batch). Returns one result per candidate it handled, in order (None for
    a row another drain claimed): all of them, or those up to the one that made the drain's
    max_dispatch-th admission. Once the scope (or the shared pool) fills, the rest are held
    unread as the drain loop would (`hold_unread`, with the plans made here). Raises, having
    written nothing of the admission transaction, when it fails.

    Plans are made first, outside the transaction; an unplannable candidate fails alone and an
    ineligible one is settled as skipped (one statement each, as one at a time), after the
    transaction and only if the drain reached it."""
    max_created = options.max_dispatch - report.counts[CREATED]
    now = timezone.now()
    slots, pairs = _plan_batch(candidates, options, env, cwd, reads)
    projects_check_here(plan for _, plan in pairs)
    decided = (
        route_batch(
            pairs,
            now=now,
            caps=full,
            shared_pool=bool(options.route.auth_profile_pool),
            held=candidate_held,
            max_created=max_created,
        )
        if pairs
        else []
    )
    out: list[dict[str, Any] | None] = []
    created = 0
    for candidate, slot in zip(candidates, slots, strict=True):
        if created >= max_created:  # the drain stops here, as one at a time
            break
        if isinstance(slot, int):
            if slot >= len(decided):  # the scope (or the shared pool) filled before it
                if pairs[slot][1].refusal is not None:  # never held: as the drain loop
                    out.append(
                        _route_or_fail(candidate, options, env, cwd, full, reads)
                    )
                    continue
                out.append(hold_unread(candidate, full, report))
                continue
            outcome = decided[slot]
            if outcome is not None and outcome.refused is not None:
                out.append(failed_result(candidate, outcome.refused, now, False))
                continue
            result = None if outcome is None else outcome.result
            created += bool(result and result["kind"] == CREATED)
        elif isinstance(slot, Exception):
            result = failed_result(candidate, slot, now, False)
        else:
            result = slot.to_dict()
            if candidate.inbox_id and not inbox_claim(
                candidate, **hold_record(result, now)
            ):
                result = None
        out.append(result)
    return out


def _plan_batch(
    candidates: list[Candidate],
    options: DrainOptions,
    env: Mapping[str, str],
    cwd: str,
    reads: PlanReads,
) -> tuple[list[_Slot], list[tuple[Candidate, RoutePlan]]]:
    """Each candidate's slot, in order, and the (candidate, plan) pairs for admission."""
    route = replace(options.route, dry_run=False)
    slots: list[_Slot] = []
    pairs: list[tuple[Candidate, RoutePlan]] = []
    for candidate in candidates:
        envelope = candidate.envelope
        assert envelope is not None, "load_envelopes() before routing"
        try:
            plan = plan_route(
                kind=options.kind,
                envelope=envelope,
                options=route,
                env=env,
                cwd=cwd,
                reads=reads,
            )
        except Exception as exc:
            slots.append(exc)
            continue
        if isinstance(plan, RouteResult):  # skipped by eligibility
            slots.append(plan)
            continue
        slots.append(len(pairs))
        pairs.append((candidate, plan))
    return slots, pairs
