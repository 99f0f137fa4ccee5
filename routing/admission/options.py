"""Route options (the `route_event` / `drain` / API options, upstream names) and their
validation: `route_options(raw)` -> RouteOptions, or ValidationError naming the option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.providers import PROVIDERS
from domain.bounds import bounded_int
from domain.controls import control_refused
from domain.delivery import (
    DEFAULT_DELIVER,
    DEFAULT_REMOTE,
    parse_deliver,
    parse_github_repo,
    parse_github_reviewers,
    parse_remote,
)
from domain.errors import ValidationError
from domain.pool import (
    PROFILE_NAME_INVALID,
    parse_pool,
    valid_profile_name,
)
from domain.retry import parse_max_attempts, parse_retry_backoff
from domain.revisions import parse_max_revisions
from domain.sandbox import (
    DANGER_FULL_ACCESS,
    DEFAULT_SANDBOX,
    DEFAULT_WORKTREE_MODE,
    parse_sandbox,
    parse_worktree_mode,
)
from domain.templates import DEFAULT_PROVIDER
from domain.throttle import (
    ThrottleLimits,
    parse_limit,
)
from domain.windows import MaxWindowUsed, parse_max_window_used

ROLES = ("triage", "planner", "worker", "verifier")
POOL_METADATA_KEYS = (
    "auth_profile_pool",
    "authProfilePool",
    "codewith_profile_pool",
    "codewithProfilePool",
    "profile_pool",
    "profilePool",
)
# Refused with the options, so no drain, schedule, route_event or API call fails its events
# on it one by one at the sandbox preflight (domain.sandbox, DANGER_WITHOUT_BREAK_GLASS).
DANGER_NEEDS_BREAK_GLASS = (
    "--sandbox danger-full-access needs --manual-break-glass "
    "(an operator's decision on the command line)"
)


# --- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteOptions:
    """The upstream `routes create` options (validated; see `route_options`)."""

    template: str | None = None
    provider: str = DEFAULT_PROVIDER
    # Whether --provider was given: when not, the provider of the named accounts, if they
    # agree, is the route's (`route_provider`). Not an option of its own (never recorded,
    # not compared: options rebuilt from a record name the provider and are the same route).
    provider_given: bool = field(default=False, compare=False)
    auth_profile: str | None = None
    auth_profile_pool: tuple[str, ...] = ()
    pins: Mapping[str, str | None] = field(default_factory=dict)
    max_active: int | None = None
    max_active_scope: str | None = None
    max_active_per_project: int | None = None
    max_active_per_project_group: int | None = None
    project_group: str | None = None
    project_path: str | None = None
    max_per_profile: int | None = None
    # Defer an account once a rate-limit window is this used (None: 0.9; off: the windows
    # are ignored; domain.windows).
    max_window_used: MaxWindowUsed | None = None
    name_prefix: str | None = None
    worktree_mode: str = DEFAULT_WORKTREE_MODE
    sandbox: str = DEFAULT_SANDBOX
    manual_break_glass: bool = False
    # Loop-level retries: attempts per admission (None = 1) and the first retry's delay in
    # seconds (None = 60), doubled per further failure up to LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS.
    max_attempts: int | None = None
    retry_backoff: int | None = None
    # Agent step time limits in seconds (None: LOOPSWEB_STEP_TIMEOUT_SECONDS and
    # LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS when the step runs), rendered as timeoutMs and
    # idleTimeoutMs into every agent step (domain.templates.render_workflow).
    step_timeout: int | None = None
    step_idle_timeout: int | None = None
    # Delivery of the run's work (domain.delivery, runs.delivery): none, branch (default),
    # push or pull-request; the remote; whether failed runs are delivered (as drafts); the
    # GitHub repository when the remote's URL does not name one.
    deliver: str = DEFAULT_DELIVER
    deliver_remote: str = DEFAULT_REMOTE
    deliver_failed: bool = False
    github_repo: str | None = None
    # Reviewers requested on the pull request a `pull-request` delivery opens (logins).
    github_reviewer: tuple[str, ...] = ()
    # Revisions of an item after its work was sent back (domain.revisions; None: the
    # default, 2; 0: off).
    max_revisions: int | None = None
    dry_run: bool = False

    @property
    def limits(self) -> ThrottleLimits:
        return ThrottleLimits(
            max_active=self.max_active,
            max_active_per_project=self.max_active_per_project,
            max_active_per_project_group=self.max_active_per_project_group,
        )

    def to_dict(self) -> dict[str, Any]:
        """The options as plain JSON (drain records, schedules)."""
        out: dict[str, Any] = {}
        for name in OPTION_NAMES:
            value = (
                getattr(self, name)
                if name not in PIN_OPTIONS
                else self.pins.get(PIN_OPTIONS[name])
            )
            if name in ("auth_profile_pool", "github_reviewer"):
                value = ",".join(value) if value else None
            if value == _DEFAULTS.get(name):
                continue  # records and schedules name only what was chosen
            # `0 in (None, False)` is true in Python: an explicit --max-per-profile 0
            # (the guard off) must be recorded, not dropped as if left at its default.
            if value is not None and value is not False and value != "":
                out[name] = value
        return out


PIN_OPTIONS = {
    "triage_auth_profile": "triage",
    "planner_auth_profile": "planner",
    "worker_auth_profile": "worker",
    "verifier_auth_profile": "verifier",
}
_DEFAULTS = {
    "worktree_mode": DEFAULT_WORKTREE_MODE,
    "sandbox": DEFAULT_SANDBOX,
    "deliver": DEFAULT_DELIVER,
    "deliver_remote": DEFAULT_REMOTE,
}
OPTION_NAMES = (
    "template",
    "provider",
    "auth_profile",
    "auth_profile_pool",
    *PIN_OPTIONS,
    "max_active",
    "max_active_scope",
    "max_active_per_project",
    "max_active_per_project_group",
    "project_group",
    "project_path",
    "max_per_profile",
    "max_window_used",
    "name_prefix",
    "worktree_mode",
    "sandbox",
    "manual_break_glass",
    "max_attempts",
    "retry_backoff",
    "step_timeout",
    "step_idle_timeout",
    "deliver",
    "deliver_remote",
    "deliver_failed",
    "github_repo",
    "github_reviewer",
    "max_revisions",
    "dry_run",
)


def _text(name: str, value: object) -> str | None:
    if value is None:
        return None
    flag = f"--{name.replace('_', '-')}"
    if not isinstance(value, str):
        raise ValidationError(f"{flag} must be a string")
    refused = control_refused(flag, value)
    if refused:
        raise ValidationError(refused)
    return value.strip() or None


def _reviewers(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        _text("github_reviewer", value)  # control characters: the common refusal
    return parse_github_reviewers(value)


def route_options(raw: Mapping[str, Any]) -> RouteOptions:
    """Validate option values (from argv, a schedule or an API body) into RouteOptions.

    Unknown keys are refused, so a typo never silently drops a cap.
    """
    unknown = sorted(set(raw) - set(OPTION_NAMES))
    if unknown:
        raise ValidationError(f"unknown route option: {unknown[0]}")
    given = _text("provider", raw.get("provider"))
    provider = given or DEFAULT_PROVIDER
    if provider not in PROVIDERS:
        raise ValidationError(f"--provider must be one of {', '.join(PROVIDERS)}")
    pool_raw = raw.get("auth_profile_pool")
    if not isinstance(pool_raw, list | tuple):
        pool_raw = _text("auth_profile_pool", pool_raw)  # refuses what is no text
    pool = tuple(parse_pool(pool_raw))
    auth_profile = _text("auth_profile", raw.get("auth_profile"))
    pins = {role: _text(flag, raw.get(flag)) for flag, role in PIN_OPTIONS.items()}
    for name in (*pool, auth_profile, *pins.values()):
        if name is not None and not valid_profile_name(name.strip()):
            raise ValidationError(PROFILE_NAME_INVALID.format(name=name))
    dry_run = raw.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ValidationError("--dry-run must be a boolean")
    break_glass = raw.get("manual_break_glass", False)
    if not isinstance(break_glass, bool):
        raise ValidationError("--manual-break-glass must be a boolean")
    deliver_failed = raw.get("deliver_failed", False)
    if not isinstance(deliver_failed, bool):
        raise ValidationError("--deliver-failed must be a boolean")
    sandbox = parse_sandbox(raw.get("sandbox"))
    if sandbox == DANGER_FULL_ACCESS and not break_glass:
        raise ValidationError(DANGER_NEEDS_BREAK_GLASS)
    return RouteOptions(
        template=_text("template", raw.get("template")),
        provider=provider,
        provider_given=given is not None,
        auth_profile=auth_profile,
        auth_profile_pool=pool,
        pins=pins,
        max_active=parse_limit("--max-active", raw.get("max_active")),
        max_active_scope=_text("max_active_scope", raw.get("max_active_scope")),
        max_active_per_project=parse_limit(
            "--max-active-per-project", raw.get("max_active_per_project")
        ),
        max_active_per_project_group=parse_limit(
            "--max-active-per-project-group", raw.get("max_active_per_project_group")
        ),
        project_group=_text("project_group", raw.get("project_group")),
        project_path=_text("project_path", raw.get("project_path")),
        max_per_profile=parse_limit(
            "--max-per-profile", raw.get("max_per_profile"), allow_zero=True
        ),
        max_window_used=parse_max_window_used(raw.get("max_window_used")),
        name_prefix=_text("name_prefix", raw.get("name_prefix")),
        worktree_mode=parse_worktree_mode(raw.get("worktree_mode")),
        sandbox=sandbox,
        manual_break_glass=break_glass,
        max_attempts=parse_max_attempts(raw.get("max_attempts")),
        retry_backoff=parse_retry_backoff(raw.get("retry_backoff")),
        step_timeout=bounded_int("--step-timeout", raw.get("step_timeout")),
        step_idle_timeout=bounded_int(
            "--step-idle-timeout", raw.get("step_idle_timeout")
        ),
        deliver=parse_deliver(raw.get("deliver")),
        deliver_remote=parse_remote(raw.get("deliver_remote")),
        deliver_failed=deliver_failed,
        github_repo=parse_github_repo(raw.get("github_repo")),
        github_reviewer=_reviewers(raw.get("github_reviewer")),
        max_revisions=parse_max_revisions(raw.get("max_revisions")),
        dry_run=dry_run,
    )


# --- the route's provider and its accounts --------------------------------------------------

PROVIDERS_DIFFER = (
    "the accounts named belong to different providers ({owners}); one route runs one "
    "provider: name accounts of one provider"
)
ACCOUNT_OTHER_PROVIDER = (
    "{accounts} to provider {owner}, not the route's provider {provider}: give "
    "--provider {owner}, or accounts of {provider}"
)


def route_provider(
    options: RouteOptions,
    registered: Mapping[str, str] | None,
    pool: Sequence[str] = (),
) -> str:
    """The route's provider, given the registry's account -> provider map and the pool in
    force (`pool`: the options' or the event's); ValidationError when it cannot run.

    1. The accounts named (the pool, --auth-profile, the role pins) that are registered
       belong to one provider, or the route is refused (naming them).
    2. Without --provider, that provider is the route's (unregistered names say nothing;
       with none registered, the default, codewith).
    3. With --provider, a registered account of another provider is refused, naming both
       providers: its steps would fail, or wait for a host that never comes."""
    names = [*(pool or options.auth_profile_pool), options.auth_profile]
    names += list(options.pins.values())
    owners: dict[str, str] = {}
    for name in names:
        if name and name.strip() in (registered or {}):
            owners[name.strip()] = (registered or {})[name.strip()]
    kinds = sorted(set(owners.values()))
    if len(kinds) > 1:
        listing = ", ".join(f"{n}: {p}" for n, p in sorted(owners.items()))
        raise ValidationError(PROVIDERS_DIFFER.format(owners=listing))
    if not kinds:
        return options.provider
    owner = kinds[0]
    if not options.provider_given or owner == options.provider:
        return owner
    accounts = sorted(owners)
    label = (
        f"account {accounts[0]} belongs"
        if len(accounts) == 1
        else f"accounts {', '.join(accounts)} belong"
    )
    raise ValidationError(
        ACCOUNT_OTHER_PROVIDER.format(
            accounts=label, owner=owner, provider=options.provider
        )
    )
