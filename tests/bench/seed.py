"""Fast, realistic ledger history for the benchmarks.

`seed_history(start, count)` writes work items [start, start + count) with everything the
schema needs behind them: one invocation per item, one run per admitted item with its step
runs, shared workflow specs, deferral history for items that waited. Item 0 is the newest;
higher indexes are older, so seeding 1,000, then 99,000 more, then 900,000 more grows the
same ledger backwards in time ("the same live work with more history behind it").

The distribution, per item:
  - status: succeeded 86 %, failed 6 %, cancelled 3 %, dead_letter 1.5 %, deferred 3 %,
    queued 0.5 %; the first ACTIVE_ITEMS items are the live set (half admitted with a queued
    run, half running), the same at every history size so only history grows;
  - route scope: 10 scopes with skewed weights, 5 % NULL (rows written before 0002);
  - project: 300 projects, Zipf-like (a few hot repositories), 15 project groups covering
    three quarters of them;
  - accounts: 12 pool accounts, the verifier never on the worker's account;
  - step runs: 2 per run (worker, verifier); deferred and queued items have no run, and as
    many todos-task runs use the 4-step task-lifecycle template, so step runs = 2 × items.

Rows go in with executemany inside large transactions on SQLite and COPY on PostgreSQL (no
ORM objects, no per-row statements): 1,000,000 items and 2,000,000 step runs take minutes,
not hours. Values are formatted as Django itself stores them (UTC timestamps, JSON text).
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction

ACTIVE_ITEMS = 24  # the live set: 12 admitted (queued runs) + 12 running
SECONDS_BETWEEN_ITEMS = 15.0  # 1,000,000 items span about 174 days
ACCOUNTS = [f"acct-{n:02d}" for n in range(1, 13)]
SCOPES: list[tuple[str, str, int]] = [
    # (route scope, route key, weight)
    ("todos-task", "todos-task", 30),
    ("generic-event", "generic-event", 20),
    ("nightly-todos", "todos-task", 12),
    ("ci-failures", "generic-event", 10),
    ("deploy-watch", "generic-event", 8),
    ("security-scan", "generic-event", 6),
    ("docs-sync", "todos-task", 5),
    ("triage-bot", "todos-task", 4),
    ("release-train", "generic-event", 3),
    ("flaky-tests", "generic-event", 2),
]
PROJECTS = [f"/srv/repos/team{k % 12:02d}/service{k:03d}" for k in range(300)]
PROJECT_WEIGHTS = [1.0 / (k + 1) ** 0.8 for k in range(300)]


def project_group(project_index: int) -> str | None:
    slot = project_index % 20
    return f"group-{slot:02d}" if slot < 15 else None


GROUPS = sorted({g for k in range(300) if (g := project_group(k))})
SOURCES = [
    ("github", "pull_request.opened"),
    ("ci", "build.failed"),
    ("sentry", "issue.created"),
]
REASONS = {
    "route_cap": "route scope {scope} active limit reached ({n}/{cap})",
    "project_cap": "project {project} active limit reached ({n}/{cap})",
    "group_cap": "project group {group} active limit reached ({n}/{cap})",
    "profile_cap": "every pool account is at --max-per-profile {cap}",
}

EPOCH_NAIVE = datetime(1970, 1, 1)
EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)


# --- writing rows fast ------------------------------------------------------------------------


def _ts_converter() -> Any:
    """Epoch seconds → what the backend stores: naive UTC text on SQLite (as Django writes
    it), an aware datetime for PostgreSQL's COPY."""
    if connection.vendor == "sqlite":
        return lambda s: (
            None
            if s is None
            else (EPOCH_NAIVE + timedelta(seconds=s)).isoformat(" ", "microseconds")
        )
    return lambda s: None if s is None else EPOCH_UTC + timedelta(seconds=s)


def _batched(rows: Iterable[Sequence[Any]], size: int) -> Iterator[list[Sequence[Any]]]:
    iterator = iter(rows)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def insert_rows(
    table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> int:
    """Insert tuples (in `columns` order); COPY on PostgreSQL, executemany on SQLite.

    Each chunk commits on its own: one huge transaction would grow SQLite's WAL (and
    PostgreSQL's deferred-FK queue) by the whole load.
    """
    cols = ", ".join(f'"{c}"' for c in columns)
    written = 0
    if connection.vendor == "postgresql":
        for chunk in _batched(rows, 200_000):
            with transaction.atomic(), connection.cursor() as cursor:
                with cursor.cursor.copy(f'COPY "{table}" ({cols}) FROM STDIN') as copy:
                    for row in chunk:
                        copy.write_row(row)
            written += len(chunk)
        return written
    sql = f'INSERT INTO "{table}" ({cols}) VALUES ({", ".join("?" * len(columns))})'
    for chunk in _batched(rows, 50_000):
        with transaction.atomic():
            connection.ensure_connection()
            connection.connection.executemany(sql, chunk)
        written += len(chunk)
    return written


def tune_for_bulk_load() -> None:
    """SQLite: a bigger page cache for this connection, so index inserts stop thrashing at
    1M rows. (PostgreSQL's COPY needs nothing; skipping FK triggers saved only ~10 %.)"""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA cache_size=-524288")  # 512 MiB, this connection only


def after_bulk_load() -> None:
    """PostgreSQL: VACUUM ANALYZE, the state autovacuum reaches within a minute of a load
    (statistics for the planner, visibility map for index-only counts). SQLite: nothing —
    Django never runs ANALYZE, so the plans we show are the ones a real install gets."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
    # A fresh connection: the benchmark measures the settings' connection, not the loader's
    # (SQLite's 512 MiB cache above would flatter every later query).
    connection.close()


class IdMaker:
    """loopsweb ids (ledger.ids): 48-bit ms timestamp + 80 random bits, reproducible."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __call__(self, seconds: float) -> str:
        ms = int(seconds * 1000) & 0xFFFFFFFFFFFF
        return f"{ms:012x}{self.rng.getrandbits(80):020x}"


# --- the history ------------------------------------------------------------------------------


@dataclass
class SeedStats:
    work_items: int = 0
    invocations: int = 0
    runs: int = 0
    step_runs: int = 0
    specs: int = 0
    deferrals: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, other: SeedStats) -> None:
        for name in (
            "work_items",
            "invocations",
            "runs",
            "step_runs",
            "specs",
            "deferrals",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for status, n in other.by_status.items():
            self.by_status[status] = self.by_status.get(status, 0) + n
        self.seconds += other.seconds


WORK_ITEM_COLUMNS = (
    "id", "created_at", "updated_at", "route_key", "idempotency_key", "source_type",
    "source_ref", "subject_ref", "project_key", "project_group", "priority", "status",
    "attempts", "next_attempt_at", "lease_expires_at", "last_reason", "invocation_id",
    "loop_id", "workflow_id", "workflow_run_id", "route_scope", "reason_code",
)  # fmt: skip
INVOCATION_COLUMNS = (
    "id", "created_at", "updated_at", "workflow_id", "template_id", "source_kind",
    "source_id", "source_dedupe_key", "source_json", "subject_kind", "subject_id",
    "subject_path", "subject_url", "subject_json", "intent", "scope_json",
    "output_policy_json",
)  # fmt: skip
RUN_COLUMNS = (
    "id", "created_at", "updated_at", "workflow_name", "scheduled_for", "idempotency_key",
    "manifest_path", "status", "started_at", "finished_at", "duration_ms", "error",
    "goal_run_id", "invocation_id", "loop_id", "loop_run_id", "workflow_id",
    "work_item_id", "claimed_by", "lease_expires_at",
)  # fmt: skip
STEP_COLUMNS = (
    "id", "created_at", "updated_at", "step_id", "sequence", "status", "started_at",
    "finished_at", "exit_code", "pid", "duration_ms", "stdout", "stderr", "error",
    "account_profile", "account_tool", "goal_run_id", "workflow_run_id",
)  # fmt: skip
SPEC_COLUMNS = (
    "id", "created_at", "updated_at", "name", "description", "version", "status",
    "goal_json", "steps_json",
)  # fmt: skip
DEFERRAL_COLUMNS = (
    "id", "reason_code", "reason", "route_scope", "project_key", "project_group",
    "counts_json", "limits_json", "created_at", "work_item_id",
)  # fmt: skip

TWO_STEPS = ("worker", "verifier")
FOUR_STEPS = ("triage", "planner", "worker", "verifier")
ITEMS_PER_SPEC = (
    100  # specs are shared: the runs need one, the benchmarks never read them
)


def _steps_json(roles: Sequence[str]) -> str:
    return json.dumps(
        [
            {
                "id": role,
                "role": role,
                "kind": "agent",
                "target": {
                    "type": "agent",
                    "provider": "codewith",
                    "sandbox": "workspace-write",
                },
                "routing": {"role": role},
            }
            for role in roles
        ]
    )


@dataclass
class _Rows:
    items: list[tuple[Any, ...]] = field(default_factory=list)
    invocations: list[tuple[Any, ...]] = field(default_factory=list)
    runs: list[tuple[Any, ...]] = field(default_factory=list)
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    specs: list[tuple[Any, ...]] = field(default_factory=list)
    deferrals: list[tuple[Any, ...]] = field(default_factory=list)


def _history_status(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.86:
        return "succeeded"
    if r < 0.92:
        return "failed"
    if r < 0.95:
        return "cancelled"
    if r < 0.965:
        return "dead_letter"
    if r < 0.995:
        return "deferred"
    return "queued"


# Outcome per item status: (run status, step statuses for a 2- or 4-step run).
def _step_statuses(status: str, n: int, rng: random.Random) -> tuple[str, list[str]]:
    if status == "succeeded":
        return "succeeded", ["succeeded"] * n
    if status == "failed":
        k = rng.randrange(n)  # the failing step; later ones were skipped at finalize
        return "failed", ["succeeded"] * k + ["failed"] + ["skipped"] * (n - k - 1)
    if status == "dead_letter":
        return "timed_out", ["timed_out"] + ["skipped"] * (n - 1)
    if status == "cancelled":
        return "cancelled", ["cancelled"] * n
    if status == "running":
        return "running", ["running"] + ["pending"] * (n - 1)
    return "queued", ["pending"] * n  # admitted: reserved, not started


def _generate(
    start: int, count: int, now: float, rng: random.Random, ts: Any
) -> Iterator[_Rows]:
    """Rows for items [start, start + count), oldest first, in chunks of 20,000 items."""
    new_id = IdMaker(rng)
    scope_weights = [w for _, _, w in SCOPES]
    indexes = list(range(start + count - 1, start - 1, -1))  # oldest first: ids ascend
    for chunk in _batched(((i,) for i in indexes), 20_000):
        rows = _Rows()
        for (i,) in chunk:
            active = i < ACTIVE_ITEMS
            created = now - (i + 1) * SECONDS_BETWEEN_ITEMS - rng.random() * 5
            if active:
                created = now - 60 * (
                    i + 1
                )  # the live set arrived in the last half hour
                status = "admitted" if i % 2 == 0 else "running"
                p = rng.randrange(50)  # spread over the busier projects
            else:
                status = _history_status(rng)
                p = rng.choices(range(300), PROJECT_WEIGHTS)[0]
            project, group = PROJECTS[p], project_group(p)
            scope, route_key, _ = rng.choices(SCOPES, scope_weights)[0]
            route_scope: str | None = scope
            if not active and rng.random() < 0.05:
                route_scope = None  # written before migration 0002
            todos = route_key == "todos-task"
            event_id = f"hist-{i}"
            if todos:
                subject = f"task-{i:07d}"
                key = f"todos-task:{subject}"
                source, etype = "@hasna/todos", "task.created"
                template = "todos-task-worker-verifier"
            else:
                source, etype = SOURCES[i % len(SOURCES)]
                subject = event_id
                key = f"generic-event:{source}:{etype}:{event_id}"
                template = "event-worker-verifier"
            has_run = status not in ("deferred", "queued")
            four = todos and status == "succeeded" and rng.random() < 0.08
            roles = FOUR_STEPS if four else TWO_STEPS
            if four:
                template = "task-lifecycle"
            duration = 60 + rng.random() * 1800
            finished = created + duration
            updated = (
                finished
                if status in ("succeeded", "failed", "cancelled", "dead_letter")
                else created
            )

            inv_id = new_id(created)
            rows.invocations.append(
                (
                    inv_id, ts(created), ts(created), None, template, "event", event_id, key,
                    f'{{"kind": "event", "id": "{event_id}", "dedupeKey": "{key}", "raw": {{"source": "{source}", "type": "{etype}"}}}}',
                    "task" if todos else "event", subject, project, None,
                    f'{{"kind": "{"task" if todos else "event"}", "id": "{subject}", "path": "{project}", "raw": {{"title": "Fix {subject}"}}}}',
                    "route",
                    f'{{"projectPath": "{project}", "projectGroup": {json.dumps(group)}, "worktreePolicy": "auto", "accountPolicy": "pool", "routeScope": {json.dumps(route_scope)}}}',
                    '{"report": "always", "createTask": "on_failure"}',
                )
            )  # fmt: skip
            item_id = new_id(created)
            spec_index = i // ITEMS_PER_SPEC
            spec_id = f"{spec_index:012x}{'s' * 4}{0:016x}"  # see _spec_rows
            run_id = new_id(created + 1) if has_run else None
            reason_code = None
            last_reason = f"admitted by {route_key} route" if has_run else None
            if status == "deferred":
                reason_code = rng.choice(list(REASONS))
                last_reason = REASONS[reason_code].format(
                    scope=route_scope, project=project, group=group, n=5, cap=5
                )
            rows.items.append(
                (
                    item_id, ts(created), ts(updated), route_key, key, etype, event_id, subject,
                    project, group, 0, status, 1 if has_run else 0, None, None, last_reason,
                    inv_id, None, spec_id if has_run else None, run_id, route_scope, reason_code,
                )
            )  # fmt: skip
            if status == "deferred" or (has_run and rng.random() < 0.04):
                for d in range(1 + (rng.randrange(3) if status == "deferred" else 0)):
                    code = reason_code or rng.choice(list(REASONS))
                    rows.deferrals.append(
                        (
                            new_id(created + d), code,
                            REASONS[code].format(scope=route_scope, project=project, group=group, n=5, cap=5),
                            route_scope, project, group,
                            '{"scope": 5, "project": 2, "projectGroup": 4}',
                            '{"maxActive": 5, "maxActivePerProject": 3, "maxActivePerProjectGroup": 8, "maxPerProfile": 2}',
                            ts(created + d), item_id,
                        )
                    )  # fmt: skip
            if not has_run:
                continue
            run_status, step_statuses = _step_statuses(status, len(roles), rng)
            terminal = run_status not in ("running", "queued")
            started = created + 2 if run_status != "queued" else None
            rows.runs.append(
                (
                    run_id, ts(created + 1), ts(finished if terminal else created + 1),
                    f"hist:{i}:workflow", None, f"{item_id}:1", None, run_status, ts(started),
                    ts(finished) if terminal else None, int(duration * 1000) if terminal else None,
                    "step failed" if run_status in ("failed", "timed_out") else None, None,
                    inv_id, None, None, spec_id, item_id,
                    "bench-host:4242" if run_status == "running" else None,
                    ts(now + 120) if run_status == "running" else None,
                )
            )  # fmt: skip
            if active:
                # Round-robin so every account carries the same live load (2 at most).
                worker = (
                    ACCOUNTS[(i // 2) % len(ACCOUNTS)]
                    if status == "admitted"
                    else ACCOUNTS[(i // 2 + 6) % len(ACCOUNTS)]
                )
            else:
                worker = rng.choice(ACCOUNTS)
            for seq, (role, st) in enumerate(zip(roles, step_statuses, strict=True)):
                account = (
                    worker
                    if role == "worker"
                    else ACCOUNTS[(ACCOUNTS.index(worker) + 1 + seq) % len(ACCOUNTS)]
                )
                ran = st not in ("pending", "skipped", "cancelled")
                step_start = created + 2 + seq * duration / len(roles)
                step_end = step_start + duration / len(roles)
                done = st in ("succeeded", "failed", "timed_out")
                rows.steps.append(
                    (
                        new_id(created + 1), ts(created + 1), ts(step_end if done else created + 1),
                        role, seq, st, ts(step_start) if ran else None, ts(step_end) if done else None,
                        (0 if st == "succeeded" else 1) if done else None, None,
                        int(duration * 1000 / len(roles)) if done else None,
                        f"{role} finished: 3 files changed, checks passed" if st == "succeeded" else None,
                        "exit status 1" if st in ("failed", "timed_out") else None,
                        None, account, "codewith", None, run_id,
                    )
                )  # fmt: skip
        yield rows


def _spec_rows(
    start: int, count: int, now: float, ts: Any
) -> Iterator[tuple[Any, ...]]:
    """The shared specs for items [start, start + count) (spec k serves items k*100…)."""
    two, four = _steps_json(TWO_STEPS), _steps_json(FOUR_STEPS)
    first = start // ITEMS_PER_SPEC
    if start % ITEMS_PER_SPEC:
        first += 1  # that spec was written with the previous batch
    last = (start + count - 1) // ITEMS_PER_SPEC
    for k in range(last, first - 1, -1):
        created = now - (k * ITEMS_PER_SPEC + 1) * SECONDS_BETWEEN_ITEMS
        yield (
            f"{k:012x}{'s' * 4}{0:016x}", ts(created), ts(created), f"hist-spec-{k}",
            "history spec shared by 100 items", 1, "archived", None, four if k % 10 == 0 else two,
        )  # fmt: skip


def seed_history(
    start: int, count: int, *, now: float | None = None, seed: int = 42
) -> SeedStats:
    """Write items [start, start + count) and their rows (see the module docstring)."""
    clock = time.monotonic()
    now = time.time() if now is None else now
    rng = random.Random(seed * 1_000_003 + start)
    ts = _ts_converter()
    stats = SeedStats()
    tune_for_bulk_load()
    stats.specs = insert_rows(
        "workflow_specs", SPEC_COLUMNS, _spec_rows(start, count, now, ts)
    )
    for rows in _generate(start, count, now, rng, ts):
        # Parents first: FK constraints are checked at each chunk's commit.
        stats.invocations += insert_rows(
            "workflow_invocations", INVOCATION_COLUMNS, rows.invocations
        )
        stats.runs += insert_rows("workflow_runs", RUN_COLUMNS, rows.runs)
        stats.work_items += insert_rows(
            "workflow_work_items", WORK_ITEM_COLUMNS, rows.items
        )
        stats.step_runs += insert_rows("workflow_step_runs", STEP_COLUMNS, rows.steps)
        stats.deferrals += insert_rows(
            "workflow_work_item_deferrals", DEFERRAL_COLUMNS, rows.deferrals
        )
        for row in rows.items:
            stats.by_status[row[11]] = stats.by_status.get(row[11], 0) + 1
    # Rows written directly: set the kept account loads to their recount
    # (ledger.services.account_loads).
    from ledger.services.account_loads import repair_account_loads

    repair_account_loads()
    stats.seconds = time.monotonic() - clock
    return stats


# --- what the pages show besides items --------------------------------------------------------

DRAIN_COLUMNS = (
    "id", "kind", "name", "route_scope", "source", "dry_run", "options_json", "started_at",
    "finished_at", "duration_ms", "scanned", "candidates", "considered", "created", "deduped",
    "throttled", "skipped", "fatal", "results_json", "evidence_path", "error",
)  # fmt: skip
INBOX_COLUMNS = (
    "id", "source", "event_id", "event_type", "subject", "event_time", "data", "metadata",
    "project_hint", "state", "work_item_id", "last_reason", "reason_code", "route_attempts",
    "received_at", "routed_at", "updated_at",
)  # fmt: skip
COOLDOWN_COLUMNS = (
    "created_at", "updated_at", "account_profile", "account_tool", "until", "reason",
    "reports", "step_run_id",
)  # fmt: skip


def seed_operations(*, drains: int, now: float | None = None, seed: int = 7) -> None:
    """Drain records (every 5 minutes, newest first) and account cooldowns (one cooling)."""
    now = time.time() if now is None else now
    rng = random.Random(seed)
    ts = _ts_converter()
    new_id = IdMaker(rng)

    def drain_rows() -> Iterator[tuple[Any, ...]]:
        for k in range(drains - 1, -1, -1):
            started = now - 300 * (k + 1)
            results = [
                {"kind": "created", "eventId": f"hist-{k * 10 + j}", "workItemStatus": "admitted",
                 "routeScope": "generic-event", "accountProfiles": {"worker": ACCOUNTS[j % 12]}}
                if j % 3 else
                {"kind": "throttled", "eventId": f"hist-{k * 10 + j}", "reasonCode": "project_cap",
                 "reason": "project active limit reached (3/3)", "precheck": True}
                for j in range(10)
            ]  # fmt: skip
            yield (
                new_id(started), "generic-event", "scheduled-drain", "scheduled-drain", "inbox",
                False, '{"kind": "generic", "max_dispatch": 10, "limit": 50}', ts(started),
                ts(started + 2), 2000, 50, 40, 10, 7, 0, 3, 0, 0, json.dumps(results), None, None,
            )  # fmt: skip

    insert_rows("routing_drains", DRAIN_COLUMNS, drain_rows())
    insert_rows(
        "account_cooldowns",
        COOLDOWN_COLUMNS,
        [
            (ts(now - 600), ts(now - 600), ACCOUNTS[3], "codewith", ts(now + 1200),
             "429 Too Many Requests (Retry-After: 1800)", 2, None),
            (ts(now - 86400), ts(now - 86400), ACCOUNTS[7], "codewith", ts(now - 80000),
             "usage limit reached", 1, None),
        ],
    )  # fmt: skip


def inbox_rows(
    count: int,
    *,
    start: int = 0,
    state: str = "pending",
    prefix: str = "bench",
    projects: Sequence[tuple[str, str | None]] | None = None,
    now: float | None = None,
    seed: int = 11,
) -> Iterator[tuple[Any, ...]]:
    """Generic event envelopes as the inbox stores them (what `inbox_ingest` writes)."""
    now = time.time() if now is None else now
    rng = random.Random(seed + start)
    ts = _ts_converter()
    new_id = IdMaker(rng)
    chosen = projects or [(PROJECTS[k], project_group(k)) for k in range(40)]
    for n in range(start, start + count):
        received = now - (start + count - n) * 0.01  # oldest first, 10 ms apart
        project, group = chosen[n % len(chosen)]
        event_id = f"{prefix}-{n}"
        group_field = f', "project_group": "{group}"' if group else ""
        yield (
            new_id(received), "ci", event_id, "build.failed", f"build-{n}", None,
            f'{{"project_path": "{project}"{group_field}, "message": "build {n} failed on main", '
            f'"title": "CI failure {n}", "tags": ["ci", "auto:route"]}}',
            '{"delivery": "bench"}', project, state, None, None, None, 0,
            ts(received), None, ts(received),
        )  # fmt: skip


def seed_inbox(count: int, **kwargs: Any) -> int:
    return insert_rows(
        "routing_inbox_events", INBOX_COLUMNS, inbox_rows(count, **kwargs)
    )
