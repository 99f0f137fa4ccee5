"""The caps drains configure. Caps are not stored anywhere as such: they are options of
drains. The caps shown (ops pages, API, metrics) are read from the drain schedules and from
the latest real drain of each route scope; the strictest wins.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    F,
    Window,
)
from django.db.models.functions import RowNumber
from django_q.models import Schedule

from domain.bounds import bounded_int
from domain.errors import ValidationError
from domain.pool import max_per_profile_in_force, parse_pool
from domain.templates import DEFAULT_PROVIDER, pool_routing_active
from routing.admission import PIN_OPTIONS
from routing.models import DrainRecord

# The django-q2 function every scheduled drain runs (routing.management.commands.schedule_drain).
DRAIN_FUNC = "routing.tasks.drain"
# Drains older than this no longer say what the caps are (a scope that has not drained for a
# month shows "no cap" unless a schedule names one). Bounds the latest-drain-per-scope scan.
CAP_LOOKBACK = timedelta(days=30)


# --- caps from drain configurations -----------------------------------------------------------


@dataclass(frozen=True)
class DrainConfig:
    """The caps one drain configuration applies: a schedule, or the latest drain of a scope."""

    origin: str  # "schedule" or "drain"
    label: str  # the schedule's name, or the drain record's id
    scope: str
    at: datetime | None
    max_active: int | None = None
    max_active_per_project: int | None = None
    max_active_per_project_group: int | None = None
    pool: tuple[str, ...] = ()
    # Effective --max-per-profile: None when it does not apply (no pool routing, or 0).
    # Decided without the account registry: a pool of registered non-codewith accounts
    # routes too (domain/templates.py, "pool routing"), which `per_profile_cap(registered)` knows.
    max_per_profile: int | None = None
    provider: str = DEFAULT_PROVIDER
    pinned: bool = False
    max_per_profile_option: int | None = None

    def per_profile_cap(
        self, registered: Mapping[str, str] | None = None
    ) -> int | None:
        """The --max-per-profile in force on this configuration's pool, given the
        registry's account -> provider map: the option, or its default (2) when the pool
        routes; None when the pool does not route or the option is 0."""
        if registered is None:
            return self.max_per_profile
        routes = pool_routing_active(
            provider=self.provider,
            pool=self.pool,
            pins={"worker": "pinned" if self.pinned else None},
            registered=registered,
        )
        return max_per_profile_in_force(self.max_per_profile_option, pool_routes=routes)


@dataclass(frozen=True)
class Cap:
    limit: int
    source: DrainConfig


def _int(value: Any, flag: str) -> int | None:
    """A stored cap option as the drain would read it (the bounds table); None when it is
    unset or not a value the drain would accept (a schedule edited by hand, say)."""
    try:
        return bounded_int(flag, value, minimum=0)
    except ValidationError:
        return None


def drain_config(
    *,
    origin: str,
    label: str,
    scope: str,
    at: datetime | None,
    options: Mapping[str, Any],
) -> DrainConfig:
    """A DrainConfig from stored drain options (`DrainOptions.to_dict()` shape)."""
    pool = parse_pool(options.get("auth_profile_pool"))
    provider = options.get("provider") or DEFAULT_PROVIDER
    pins = {
        role: options.get(flag) if isinstance(options.get(flag), str) else None
        for flag, role in PIN_OPTIONS.items()
    }
    per_profile_option = _int(options.get("max_per_profile"), "--max-per-profile")
    effective = max_per_profile_in_force(
        per_profile_option,
        pool_routes=pool_routing_active(provider=provider, pool=pool, pins=pins),
    )
    return DrainConfig(
        origin=origin,
        label=label,
        scope=scope,
        at=at,
        max_active=_int(options.get("max_active"), "--max-active"),
        max_active_per_project=_int(
            options.get("max_active_per_project"), "--max-active-per-project"
        ),
        max_active_per_project_group=_int(
            options.get("max_active_per_project_group"),
            "--max-active-per-project-group",
        ),
        pool=tuple(pool),
        max_per_profile=effective,
        provider=str(provider),
        pinned=any(pins.values()),
        max_per_profile_option=per_profile_option,
    )


def _schedule_kwargs(text: str | None) -> dict[str, Any]:
    # schedule_drain stores repr() of a dict of plain literals; never eval anything else.
    try:
        value = ast.literal_eval(text or "{}")
    except (ValueError, SyntaxError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class ScheduledDrain:
    name: str
    kind: str | None
    every_minutes: int | None
    cron: str | None
    next_run: datetime | None
    options: dict[str, Any]
    id: int | None = None  # the django-q2 Schedule row (pause, resume, run now)
    paused: bool = False  # repeats 0: the scheduler skips it


def scheduled_drains() -> list[ScheduledDrain]:
    """Every drain schedule (django-q2 rows made by `schedule_drain`), by name. One query."""
    out = []
    for schedule in Schedule.objects.filter(func=DRAIN_FUNC).order_by("name"):
        kwargs = _schedule_kwargs(schedule.kwargs)
        options = kwargs.get("options")
        out.append(
            ScheduledDrain(
                name=schedule.name or "",
                kind=kwargs.get("kind"),
                every_minutes=schedule.minutes
                if schedule.schedule_type == Schedule.MINUTES
                else None,
                cron=schedule.cron,
                next_run=schedule.next_run,
                options=options if isinstance(options, dict) else {},
                id=schedule.id,
                paused=schedule.repeats == 0,
            )
        )
    return out


def drain_configs(
    *, now: datetime, schedules: Sequence[ScheduledDrain] | None = None
) -> list[DrainConfig]:
    """Schedules first, then the latest real drain of each route scope in CAP_LOOKBACK.

    Two queries (one when `schedules` is given): the schedules, and one window query that
    keeps the newest drain record per scope.
    """
    configs = []
    for schedule in scheduled_drains() if schedules is None else schedules:
        scope = schedule.options.get("max_active_scope") or schedule.name
        configs.append(
            drain_config(
                origin="schedule",
                label=schedule.name,
                scope=str(scope),
                at=schedule.next_run,
                options=schedule.options,
            )
        )
    latest = (
        DrainRecord.objects.filter(dry_run=False, started_at__gte=now - CAP_LOOKBACK)
        .annotate(
            newest=Window(
                RowNumber(),
                partition_by=[F("route_scope")],
                order_by=F("started_at").desc(),
            )
        )
        .filter(newest=1)
        .values_list("id", "route_scope", "started_at", "options_json")
    )
    for record_id, scope, started_at, options in latest:
        configs.append(
            drain_config(
                origin="drain",
                label=record_id,
                scope=scope or "",
                at=started_at,
                options=options if isinstance(options, dict) else {},
            )
        )
    return configs


def strictest(
    configs: Iterable[DrainConfig], limit_of: Callable[[DrainConfig], int | None]
) -> Cap | None:
    """The smallest limit any configuration applies (admission defers at the strictest)."""
    best: Cap | None = None
    for config in configs:
        limit = limit_of(config)
        if limit is not None and (best is None or limit < best.limit):
            best = Cap(limit=limit, source=config)
    return best
