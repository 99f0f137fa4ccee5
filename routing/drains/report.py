"""A drain's report: counts, compact results (upstream fields), the stored drain record
and the private (0600) evidence file.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.utils import timezone

from domain.errors import ValidationError
from routing.admission import (
    CREATED,
    DEDUPED,
    SKIPPED,
    THROTTLED,
)
from routing.drains.options import DrainOptions
from routing.models import DrainRecord

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
            "freshnessClosed": 0,
            "fatal": 0,
        }
    )
    duration_ms: int = 0
    evidence_path: str | None = None
    record_id: str | None = None
    error: str | None = None
    # Why the drain record could not be stored (the database stayed away; see drains.outage).
    record_error: str | None = None
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
            # Upstream's name for the candidates left after the post-filters (docs/upstream.md §5.3);
            # loopsweb's `candidates` counts the same rows.
            "filteredCandidates": self.candidates,
            # docs/upstream.md §5.3: the scan window ran out before `limit` candidates were found.
            "scanExhausted": self.scanned >= self.options.effective_scan_limit
            and self.candidates < self.options.limit,
            "considered": self.counts["considered"],
            "created": self.counts[CREATED],
            "deduped": self.counts[DEDUPED],
            "throttled": self.counts[THROTTLED],
            "skipped": self.counts[SKIPPED],
            # docs/upstream.md §5.3: the review gate's freshness skips (merged/closed PRs).
            "freshnessClosed": self.counts["freshnessClosed"],
            "fatal": self.counts["fatal"],
            "maxDispatch": self.options.max_dispatch,
            "dryRun": self.dry_run,
            "durationMs": self.duration_ms,
            "error": self.error,
            "recordError": self.record_error,
            "heldReason": self.held_reason,
            "overlapSkipped": self.overlapped,
            "results": self.compact_results() if compact else self.results,
            "evidencePath": self.evidence_path,
        }

    @property
    def stopped_by_max_dispatch(self) -> bool:
        """The drain stopped because it made --max-dispatch admissions."""
        return self.counts[CREATED] >= self.options.max_dispatch

    @property
    def candidates_left(self) -> int:
        return max(0, self.candidates - self.counts["considered"])

    def result_lines(self) -> list[str]:
        """One line per result: kind, item, and why (text output; docs/upstream.md §5.3's compact fields)."""
        return [result_line(compact_result(r)) for r in self.results]

    def human(self) -> str:
        if self.overlapped:
            return (
                f"drain skipped: another {self.route_key} drain of scope "
                f"{self.route_scope} is running (overlap skip)"
            )
        c = self.counts
        prefix = "dry-run " if self.dry_run else ""
        line = (
            f"{prefix}drained {self.options.source} queue ({self.route_key}, scope {self.route_scope}): "
            f"considered={c['considered']} created={c[CREATED]} deduped={c[DEDUPED]} "
            f"throttled={c[THROTTLED]} skipped={c[SKIPPED]} "
            f"freshnessClosed={c['freshnessClosed']} fatal={c['fatal']}"
            + (f" (held: {self.held_reason})" if self.held_reason else "")
        )
        verb = "would be admitted" if self.dry_run else "admitted"
        summary = f"{c[CREATED]} {verb}"
        if self.stopped_by_max_dispatch and self.candidates_left:
            summary += (
                f"; --max-dispatch {self.options.max_dispatch} stopped the drain, "
                f"{self.candidates_left} candidate"
                f"{'' if self.candidates_left == 1 else 's'} left"
            )
        elif self.candidates_left:
            summary += f"; {self.candidates_left} candidates not reached"
        return f"{line}\n{summary}"


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
    "queuedAtSource",
    "precheck",
    "routeError",
    "freshnessSkip",
    "prState",
    "fatal",
)


def compact_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """The docs/upstream.md §5.3 compact fields of one full result."""
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
        "queuedAtSource": result.get("queuedAtSource"),
        "precheck": result.get("precheck"),
        "routeError": result.get("routeError"),
        "freshnessSkip": result.get("freshnessSkip"),
        "prState": result.get("prState"),
        "fatal": result.get("fatal"),
    }
    return {k: v for k, v in flat.items() if v is not None}


def result_line(result: Mapping[str, Any]) -> str:
    """`<kind> <item>: <why>`, the item being the task (or event) it came from."""
    item = (
        f"task {result['taskId']}"
        if result.get("taskId")
        else f"event {result.get('eventId') or '-'}"
    )
    kind = result.get("kind") or "?"
    if kind == CREATED:
        why = f"loop {result.get('loopId')} ({result.get('loopName')})"
        if result.get("accountProfiles"):
            accounts = ", ".join(
                f"{role}={profile}"
                for role, profile in sorted(result["accountProfiles"].items())
            )
            why += f" accounts {accounts}"
    elif kind == DEDUPED:
        why = f"existing work item {result.get('workItemId')} ({result.get('workItemStatus')})"
    else:
        why = result.get("reason") or "-"
        if result.get("fatal"):
            why = f"error: {why}"
    return f"  {kind:<9} {item}: {why}"


EVIDENCE_NOT_A_DIRECTORY = "--evidence-dir {path} is not a directory"
EVIDENCE_CANNOT_CREATE = "--evidence-dir {path} cannot be created: {reason}"
EVIDENCE_NOT_WRITABLE = "--evidence-dir {path} is not writable: {reason}"


def evidence_dir_prepare(directory: str) -> None:
    """Make sure the drain can write its evidence file there, before it admits anything.

    A missing directory is created 0700 (only one the drain creates: an existing directory,
    say a shared 1777 one, keeps its mode). A path that is a file, cannot be created (under
    /proc, a missing parent we cannot write) or cannot be written raises ValidationError.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValidationError(EVIDENCE_NOT_A_DIRECTORY.format(path=directory))
    if not path.exists():
        try:
            path.mkdir(mode=0o700, parents=True)
            os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
        except FileExistsError:
            if not path.is_dir():
                raise ValidationError(
                    EVIDENCE_NOT_A_DIRECTORY.format(path=directory)
                ) from None
        except OSError as exc:
            raise ValidationError(
                EVIDENCE_CANNOT_CREATE.format(path=directory, reason=exc.strerror)
            ) from None
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".loopsweb-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValidationError(
            EVIDENCE_NOT_WRITABLE.format(path=directory, reason=exc.strerror)
        ) from None


def evidence_write(
    directory: str, route_key: str, started_at: datetime, report: dict[str, Any]
) -> str:
    """Write the full report privately (file 0600, never overwriting) into a directory
    `evidence_dir_prepare` checked before the drain started."""
    path = Path(directory)
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


def report_count(report: DrainReport, result: dict[str, Any]) -> None:
    report.results.append(result)
    report.counts["considered"] += 1
    if result.get("fatal"):
        report.counts["fatal"] += 1
    if result.get("freshnessSkip") and not report.dry_run:
        report.counts["freshnessClosed"] += 1
    report.counts[result["kind"]] += 1


def drain_record_fields(report: DrainReport) -> dict[str, Any]:
    """The drain record's columns from the report, finished now."""
    c = report.counts
    return {
        "kind": report.route_key,
        "name": report.options.name,
        "route_scope": report.route_scope,
        "source": report.options.source,
        "dry_run": report.dry_run,
        "options_json": report.options.to_dict(),
        "started_at": report.started_at,
        "finished_at": timezone.now(),
        "duration_ms": report.duration_ms,
        "scanned": report.scanned,
        "candidates": report.candidates,
        "considered": c["considered"],
        "created": c[CREATED],
        "deduped": c[DEDUPED],
        "throttled": c[THROTTLED],
        "skipped": c[SKIPPED],
        "fatal": c["fatal"],
        "freshness_closed": c["freshnessClosed"],
        "results_json": report.compact_results(),
        "evidence_path": report.evidence_path,
        "error": report.error,
        "held_reason": report.held_reason,
    }


def drain_record_save(report: DrainReport) -> DrainRecord:
    """The drain's record, complete: the one written at its start (drains.record_keeper)
    finished, or a new one."""
    fields = drain_record_fields(report)
    if report.record_id is not None:
        if DrainRecord.objects.filter(pk=report.record_id).update(**fields):
            return DrainRecord.objects.get(pk=report.record_id)
    return DrainRecord.objects.create(**fields)
