"""Drain options (`drain` command, schedules, the drain task) and their validation."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.bounds import bounded_int
from domain.controls import control_refused
from domain.errors import ValidationError
from domain.keys import route_key_for_kind
from domain.scope import LOOP_NAME_ENV
from routing.admission import (
    RouteOptions,
    checked_route_options,
    route_options_resolve,
)
from routing.drains.sources import (
    COMMAND_SOURCE,
    INBOX_SOURCE,
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
    parsed = bounded_int(flag, value)
    return default if parsed is None else parsed


PREFIX_NOT_ABSOLUTE = (
    "--project-path-prefix must be an absolute path (project paths are stored absolute)"
)


def _refuse_controls(flag: str, value: str) -> None:
    refused = control_refused(flag, value)
    if refused:
        raise ValidationError(refused)


def project_path_prefix(value: Any) -> str | None:
    """The prefix a drain's candidates' project paths must start with; a relative one could
    never match, so it is refused rather than accepted to drain nothing."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError("--project-path-prefix must be a string")
    _refuse_controls("--project-path-prefix", value)
    prefix = value.strip()
    if not prefix:
        return None
    if not os.path.isabs(prefix):
        raise ValidationError(PREFIX_NOT_ABSOLUTE)
    return prefix


def drain_options(
    kind: str,
    raw: Mapping[str, Any],
    *,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> DrainOptions:
    """Validate drain options from argv, a schedule's kwargs or an API body: each option on
    its own, then together as a route would use them (`route_options_check`, with the loop
    name a drain named `name` runs under), then against the account registry and the hosts
    (`route_options_resolve`: the provider defaults from the pool's accounts; a pool of
    another provider's accounts, or a provider no host serves, is refused), so a bad option
    never reaches a candidate."""
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
    scan_limit = bounded_int("--scan-limit", drain_raw.get("scan_limit"))
    for tag in tags:
        _refuse_controls("--tags", str(tag))
    prefix = project_path_prefix(drain_raw.get("project_path_prefix"))
    environ = dict(os.environ if env is None else env)
    if name:
        environ[LOOP_NAME_ENV] = (
            name  # as drain_run: a scheduled drain's scope is its name
        )
    route = route_options_resolve(checked_route_options(kind, route_raw, env=environ))
    return DrainOptions(
        kind=kind,
        route=route,
        max_dispatch=_positive("--max-dispatch", drain_raw.get("max_dispatch"), 1),
        limit=_positive("--limit", drain_raw.get("limit"), 50),
        scan_limit=scan_limit,
        tags=tuple(tags),
        project_path_prefix=prefix,
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
