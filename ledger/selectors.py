"""Reads of the ledger that decisions depend on. Counts come from rows, or from counts kept
in the same transactions as the rows and proven equal to a recount
(ledger.services.account_loads).

Each count is its own indexed query so that the cost stays flat as history grows:
  - scope:   idx_workflow_work_items_scope   (route_scope, status)
  - project: idx_workflow_work_items_project (project_key, status)
  - group:   idx_workflow_work_items_group   (project_group, status)
  - account load: workflow_account_loads, one row per account (ledger.services.account_loads).

Time windows are primary-key ranges: ledger ids start with their creation time in ms (see
ledger.ids), so "created since T" is a key range even where a table has no timestamp index
(`created_since`, `created_before`); `distinct_values` lists an indexed column's values with
a loose index scan. The admin filters and the ops pages share these.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Field, Model, QuerySet

from domain.pool import HangMark

# Re-exported: the pool picture (loads, cooldowns, limits, windows) is read in
# ledger.account_state.
from ledger.account_state import AccountLimits as AccountLimits
from ledger.account_state import AccountLoad as AccountLoad
from ledger.account_state import AccountState as AccountState
from ledger.account_state import account_load as account_load
from ledger.account_state import account_state as account_state
from ledger.account_state import aware
from ledger.models import (
    ACTIVE_WORK_ITEM_STATUSES,
    Account,
    AccountCooldown,
    AccountLoadCount,
    SpecStatus,
    WorkflowInvocation,
    WorkflowSpec,
    WorkflowStepAttempt,
    WorkflowWorkItem,
)


@dataclass(frozen=True)
class ActiveCounts:
    scope: int
    project: int
    project_group: int | None


_ITEMS = WorkflowWorkItem._meta.db_table
_ACTIVE_SQL = f'SELECT COUNT(*) FROM "{_ITEMS}" WHERE "status" IN (%s, %s)'


def _scope_filter(scope: str | None) -> tuple[str, list[str]]:
    """The condition that counts an active item toward `scope`, and its parameters: a scope
    counts the items whose route_scope equals it (NULL-scope rows, older rows, never count
    toward a scoped total); no scope counts every active item (upstream's unscoped global
    count). The one place this rule is written."""
    if scope:
        return ' AND "route_scope" = %s', [scope]
    return "", []


def _active_count_parts(
    scope: str | None, project_key: str | None, project_group: str | None
) -> tuple[list[str], list[str]]:
    """The three scalar subqueries of `active_counts` (scope, project, group) and their
    parameters, for a SELECT of its own or one shared with other reads."""
    active = [str(s) for s in ACTIVE_WORK_ITEM_STATUSES]
    condition, scope_params = _scope_filter(scope)
    parts = [f"({_ACTIVE_SQL}{condition})"]
    params = [*active, *scope_params]
    for column, value in (
        ("project_key", project_key),
        ("project_group", project_group),
    ):
        if value:
            parts.append(f'({_ACTIVE_SQL} AND "{column}" = %s)')
            params += [*active, value]
        else:
            parts.append("NULL")
    return parts, params


@dataclass
class ActiveCountsByKey:
    """Active items per route scope ("" for no scope), per project and per group."""

    scope: dict[str, int] = field(default_factory=dict)
    project: dict[str, int] = field(default_factory=dict)
    group: dict[str, int] = field(default_factory=dict)


def active_counts_by_key(
    *,
    scopes: Iterable[str | None],
    projects: Iterable[str | None],
    groups: Iterable[str | None],
) -> ActiveCountsByKey:
    """`active_counts` for many scopes, projects and groups at once, in one statement (a
    drain batch's reads): one indexed count per scope, one grouped count per dimension."""
    active = [str(s) for s in ACTIVE_WORK_ITEM_STATUSES]
    parts: list[str] = []
    params: list[str] = []
    for scope in sorted({s or "" for s in scopes}):
        condition, scope_params = _scope_filter(scope)
        parts.append(f"SELECT 's', %s, ({_ACTIVE_SQL}{condition})")
        params += [scope, *active, *scope_params]
    for kind, column, values in (
        ("p", "project_key", {p for p in projects if p}),
        ("g", "project_group", {g for g in groups if g}),
    ):
        if values:
            marks = ", ".join(["%s"] * len(values))
            parts.append(
                f'SELECT \'{kind}\', "{column}", COUNT(*) FROM "{_ITEMS}" '
                f'WHERE "status" IN (%s, %s) AND "{column}" IN ({marks}) GROUP BY "{column}"'
            )
            params += [*active, *sorted(values)]
    found = ActiveCountsByKey()
    if not parts:
        return found
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        for kind, key, n in cursor.fetchall():
            {"s": found.scope, "p": found.project, "g": found.group}[kind][key] = n
    return found


def _active_counts_of(
    scope_n: int, project_n: int | None, group_n: int | None, project_group: str | None
) -> ActiveCounts:
    return ActiveCounts(
        scope=scope_n,
        project=project_n or 0,
        project_group=group_n if project_group else None,
    )


def active_counts(
    *, scope: str | None, project_key: str | None, project_group: str | None
) -> ActiveCounts:
    """Active (admitted or running) work items per cap dimension, in one round trip.

    - scope: items whose route_scope equals `scope` (NULL-scope rows never count); with no
      scope, every active item (upstream's unscoped global count).
    - project: items of `project_key` across all routes (0 with no key).
    - project_group: items of the group across all routes; None when no group is set.
    One SELECT of scalar subqueries; each is served by its own (column, status) index.
    """
    parts, params = _active_count_parts(scope, project_key, project_group)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}", params)
        scope_n, project_n, group_n = cursor.fetchone()
    return _active_counts_of(scope_n, project_n, group_n, project_group)


def _db_datetime(value: datetime) -> str | datetime | None:
    # text on SQLite; PostgreSQL takes the datetime itself
    return connection.ops.adapt_datetimefield_value(value)


@dataclass(frozen=True)
class AdmissionRows:
    """Ids of the rows an admission may reuse (None where there is none yet), and the active
    counts when they were asked for."""

    work_item_id: str | None
    invocation_id: str | None
    spec_id: str | None
    active: ActiveCounts | None = None


_ADMISSION_ROWS_SQL = f"""
SELECT
    (SELECT id FROM "{WorkflowWorkItem._meta.db_table}"
     WHERE route_key = %s AND idempotency_key = %s),
    (SELECT id FROM "{WorkflowInvocation._meta.db_table}"
     WHERE source_kind = %s AND source_dedupe_key = %s),
    (SELECT id FROM "{WorkflowSpec._meta.db_table}"
     WHERE status = %s AND name = %s)
"""


def admission_rows(
    *,
    route_key: str,
    idempotency_key: str,
    workflow_name: str,
    counts: bool = False,
    scope: str | None = None,
    project_key: str | None = None,
    project_group: str | None = None,
) -> AdmissionRows:
    """The work item, the event invocation and the active spec an admission would reuse.

    One round trip of three unique-index lookups (the work items' (route_key,
    idempotency_key) key, idx_workflow_invocations_dedupe, idx_workflows_name_active). Most routed events are new,
    so the usual answer is three NULLs and no row is read in full. With `counts`, the same
    statement also returns `active_counts(scope=, project_key=, project_group=)`.
    """
    sql = _ADMISSION_ROWS_SQL
    params: list[str] = [
        route_key,
        idempotency_key,
        "event",
        idempotency_key,
        str(SpecStatus.ACTIVE),
        workflow_name,
    ]
    if counts:
        parts, more = _active_count_parts(scope, project_key, project_group)
        sql += "".join(f", {part}" for part in parts)
        params += more
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    item_id, invocation_id, spec_id = row[:3]
    return AdmissionRows(
        work_item_id=item_id,
        invocation_id=invocation_id,
        spec_id=spec_id,
        active=(
            _active_counts_of(row[3], row[4], row[5], project_group) if counts else None
        ),
    )


# --- time windows and indexed values ----------------------------------------------------------


def id_floor(moment: datetime) -> str:
    """The smallest ledger id created at or after `moment` (ids start with their ms time)."""
    return f"{int(moment.timestamp() * 1000) & 0xFFFFFFFFFFFF:012x}"


def created_since(queryset: QuerySet[Any], moment: datetime) -> QuerySet[Any]:
    """Rows created at or after `moment`, as a primary-key range (see the module docstring)."""
    return queryset.filter(pk__gte=id_floor(moment))


def created_before(queryset: QuerySet[Any], moment: datetime) -> QuerySet[Any]:
    return queryset.filter(pk__lt=id_floor(moment))


def distinct_values(
    model: type[Model], field_name: str, *, limit: int = 100
) -> list[str]:
    """Up to `limit` distinct non-NULL values of an indexed column, smallest first.

    A loose index scan (a recursive CTE that jumps to the next larger value) costs one index
    probe per distinct value, where `SELECT DISTINCT` reads every row: the difference between
    a millisecond and a second on a million work items. Portable to SQLite and PostgreSQL.
    """
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    field = model._meta.get_field(field_name)
    assert isinstance(field, Field)  # a column, not the reverse side of a relation
    column = qn(field.column)
    sql = (
        f"WITH RECURSIVE vals(v) AS ("
        f" SELECT MIN({column}) FROM {table}"
        f" UNION ALL"
        f" SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > vals.v)"
        f" FROM vals WHERE vals.v IS NOT NULL"
        f") SELECT v FROM vals WHERE v IS NOT NULL LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


# --- the account registry ---------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredAccount(HangMark):
    """One row of the account registry, as decisions read it."""

    name: str
    provider: str
    enabled: bool
    max_running: int | None
    env: dict[str, str]
    env_file: str | None = None  # read when a step starts; None without one
    # 0014: when a step's login was refused, and the agent's words (None: no mark).
    login_failed_at: datetime | None = None
    login_failed_reason: str | None = None
    # 0021: token budget per window (`{"5h": 2000000}`), None without one.
    window_budgets: dict[str, int] | None = None
    window_pace: bool = False
    unresponsive_until: datetime | None = None  # 0026: domain.pool.HangMark

    @property
    def login_failed(self) -> bool:
        return self.login_failed_at is not None


def account_registry(names: Any = None) -> dict[str, RegisteredAccount]:
    """Registered accounts by name (all of them, or only `names`); one query."""
    rows = Account.objects.all()
    if names is not None:
        rows = rows.filter(pk__in=[str(n).strip() for n in names])
    return {
        row.name: RegisteredAccount(
            name=row.name,
            provider=row.provider,
            enabled=row.enabled,
            max_running=row.max_running,
            env={str(k): str(v) for k, v in (row.env_json or {}).items()},
            env_file=row.env_file or None,
            login_failed_at=row.login_failed_at,
            login_failed_reason=row.login_failed_reason,
            window_budgets=row.window_budgets
            if isinstance(row.window_budgets, dict)
            else None,
            window_pace=bool(row.window_pace),
            unresponsive_until=row.unresponsive_until,
        )
        for row in rows
    }


def registered_providers() -> dict[str, str]:
    """Account name -> provider for every registered account (what admission plans need)."""
    return dict(Account.objects.values_list("name", "provider"))


@dataclass(frozen=True)
class AccountGate:
    """What a step start checks of one account: its registry row (None when unregistered),
    the end of its cooldown (None when not cooling at `now`), its running steps."""

    account: RegisteredAccount | None
    cooling_until: datetime | None
    running: int


_ACCOUNTS = Account._meta.db_table
_COOLDOWNS = AccountCooldown._meta.db_table
_LOADS = AccountLoadCount._meta.db_table
_GATE_SQL = (
    "SELECT a.name, a.provider, a.enabled, a.max_running, a.env_json, a.env_file, "
    "a.login_failed_at, a.login_failed_reason, a.unresponsive_until, "
    f'(SELECT c."until" FROM "{_COOLDOWNS}" c '
    'WHERE c.account_profile = p.name AND c."until" > %s), '
    f'(SELECT l.running FROM "{_LOADS}" l WHERE l.account_profile = p.name) '
    f'FROM (SELECT %s AS name) p LEFT JOIN "{_ACCOUNTS}" a ON a.name = p.name'
)


def account_gate(profile: str, *, now: datetime) -> AccountGate:
    """`AccountGate` of `profile` in one statement (registry row, cooldown, kept count)."""
    with connection.cursor() as cursor:
        cursor.execute(_GATE_SQL, [_db_datetime(now), profile])
        (
            name,
            provider,
            enabled,
            max_running,
            env,
            env_file,
            failed_at,
            failed_reason,
            hung_until,
            until,
            running,
        ) = cursor.fetchone()
    account = None
    if name is not None:
        # The stubs want an Expression: JSONField.from_db_value reads it only to spot a key
        # transform, and a raw cursor's column is none (its code takes None).
        env = Account._meta.get_field("env_json").from_db_value(env, None, connection)  # type: ignore[arg-type]
        account = RegisteredAccount(
            name=name,
            provider=provider,
            enabled=bool(enabled),
            max_running=max_running,
            env={str(k): str(v) for k, v in (env or {}).items()},
            env_file=env_file or None,
            login_failed_at=aware(failed_at) if failed_at is not None else None,
            login_failed_reason=failed_reason,
            unresponsive_until=aware(hung_until) if hung_until is not None else None,
        )
    return AccountGate(
        account=account,
        cooling_until=aware(until) if until is not None else None,
        running=running or 0,
    )


def step_attempts(step_ids: Iterable[str]) -> dict[str, list[WorkflowStepAttempt]]:
    """The attempts of these step runs by step run id, oldest first: one query (the
    step-and-start index) however many steps."""
    wanted = list(dict.fromkeys(step_ids))
    found: dict[str, list[WorkflowStepAttempt]] = {s: [] for s in wanted}
    if not wanted:
        return found
    for attempt in WorkflowStepAttempt.objects.filter(step_run_id__in=wanted).order_by(
        "step_run_id", "started_at", "id"
    ):
        found[attempt.step_run_id].append(attempt)
    return found


# The variables of an account that name its login directories (runs.sandbox binds them).
ACCOUNT_HOME_VARIABLES = (
    "CODEX_HOME",
    "CLAUDE_CONFIG_DIR",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "HOME",
)


def account_env_files() -> list[str]:
    """Every registered account's env file (runs.sandbox hides them all)."""
    return [path for path in Account.objects.values_list("env_file", flat=True) if path]


def account_homes() -> dict[str, list[str]]:
    """Account name -> the login directories its registered variables name."""
    return {
        name: [
            str(env[key])
            for key in ACCOUNT_HOME_VARIABLES
            if isinstance(env, dict) and env.get(key)
        ]
        for name, env in Account.objects.values_list("name", "env_json")
    }
