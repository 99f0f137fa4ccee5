"""The runner and its agents (providers, limits, retries) and their isolation (project
roots, worktrees, the environment agents get)."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from domain.bounds import bounded_int
from domain.delivery import parse_git_author
from domain.errors import ValidationError
from loopsweb.settings.base import DATA_DIR
from loopsweb.settings.env import (
    env_int,
    env_list,
    env_str,
)

# --- runner ---
# The workflow runner (runs.runner) and its provider adapters (runs.providers). Every value
# is read at call time through django.conf.settings, so tests may override them.

# Agent binaries, one per provider: a name looked up on PATH or an absolute path.
_PROVIDER_BINARY_DEFAULTS = {
    "codewith": "codewith",
    "claude": "claude",
    "codex": "codex",
    "cursor": "cursor-agent",
    "opencode": "opencode",
    "aicopilot": "aicopilot",
}
LOOPSWEB_PROVIDER_BINARIES = {
    provider: env_str(f"LOOPSWEB_{provider.upper()}_BIN") or default
    for provider, default in _PROVIDER_BINARY_DEFAULTS.items()
}


def _exit_codes(name: str) -> frozenset[int]:
    codes = set()
    for part in env_list(name, []):
        try:
            code = bounded_int(name, part, minimum=0, key="rate-limit exit code")
        except ValidationError:
            raise ImproperlyConfigured(
                f"{name} must be a comma list of integers from 0 to 255, got {part!r}"
            ) from None
        if code is not None:
            codes.add(code)
    return frozenset(codes)


# Exit codes that mean "rate limited" for a provider (besides 429 / rate-limit output).
LOOPSWEB_RATE_LIMIT_EXIT_CODES = {
    provider: _exit_codes(f"LOOPSWEB_{provider.upper()}_RATE_LIMIT_EXIT_CODES")
    for provider in _PROVIDER_BINARY_DEFAULTS
}
# A running run's lease; the runner renews it about three times per lease while it lives.
# Recovery fails runs whose lease expired, so this bounds how long a crashed worker pins an
# account and a cap slot.
LOOPSWEB_RUN_LEASE_SECONDS = env_int("LOOPSWEB_RUN_LEASE_SECONDS", 120)
# Bytes of stdout and of stderr kept per step (the tail; older output is dropped).
# Drain records that did nothing (no candidate considered, no error) are kept this many days,
# then pruned by the `prune-empty-drains` schedule; records that did something are kept.
LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS = env_int("LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS", 7)
LOOPSWEB_OUTPUT_TAIL_BYTES = env_int("LOOPSWEB_OUTPUT_TAIL_BYTES", 65536)
# Cooldown after a rate limit that names no reset time: base × 2^(reports−1), capped.
LOOPSWEB_COOLDOWN_BASE_SECONDS = env_int("LOOPSWEB_COOLDOWN_BASE_SECONDS", 60)
LOOPSWEB_COOLDOWN_CAP_SECONDS = env_int("LOOPSWEB_COOLDOWN_CAP_SECONDS", 3600)
# Days a rate-limit window observation is kept and read (docs/windows.md §2).
LOOPSWEB_WINDOW_KEEP_DAYS = env_int("LOOPSWEB_WINDOW_KEEP_DAYS", 8)
# How often a run waiting for its step's account (at cap or cooling) checks again.
LOOPSWEB_STEP_START_POLL_SECONDS = env_int("LOOPSWEB_STEP_START_POLL_SECONDS", 5)
# Seconds between SIGTERM and SIGKILL when a step's process group is stopped.
LOOPSWEB_KILL_GRACE_SECONDS = env_int("LOOPSWEB_KILL_GRACE_SECONDS", 5)
# How often an agent CLI retries a failed model call (codex, claude; runs/providers.py):
# few, so a rate limit reaches loopsweb in seconds and the step can move to another account.
LOOPSWEB_AGENT_MAX_RETRIES = env_int("LOOPSWEB_AGENT_MAX_RETRIES", 1)
# How many times a rate-limited agent step moves to another free member of its run's pool
# before the run fails (ledger.services.failover).
LOOPSWEB_RATE_LIMIT_MOVES = env_int("LOOPSWEB_RATE_LIMIT_MOVES", 2)
# Every agent step's time limits unless its route (--step-timeout, --step-idle-timeout) or
# the step itself (timeoutMs, idleTimeoutMs) says otherwise: in total, and without output.
LOOPSWEB_STEP_TIMEOUT_SECONDS = env_int("LOOPSWEB_STEP_TIMEOUT_SECONDS", 3600)
LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS = env_int("LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS", 600)
# An agent CLI that reports this many failed model calls in a row, with no model answer or
# tool call between them, is stopped with the provider's error (runs.agent_step).
LOOPSWEB_STEP_PROVIDER_ERRORS = env_int("LOOPSWEB_STEP_PROVIDER_ERRORS", 3)
# How long a step of a pool-routed run waits when every account of its pool is rate
# limited (holding no run worker), before its run fails with that reason (runs.runner).
LOOPSWEB_POOL_WAIT_SECONDS = env_int("LOOPSWEB_POOL_WAIT_SECONDS", 604800)
# A 429 whose named reset is at most this far off is a per-minute limit: the account
# pauses until then and the step stays on it (staggered), rather than rotating the pool
# (runs.runner; 0: every 429 moves the step).
LOOPSWEB_THROTTLE_SECONDS = env_int("LOOPSWEB_THROTTLE_SECONDS", 20)
# How long an account whose step made no progress for its idle limit (a hang) is marked
# unresponsive and skipped by pool assignment, step starts and failover (runs.runner).
LOOPSWEB_UNRESPONSIVE_SECONDS = env_int("LOOPSWEB_UNRESPONSIVE_SECONDS", 900)
# How often a running step's output tails are written to its step run (only when it printed
# something new), so /ops/ and the item page show what the agent is doing now.
LOOPSWEB_OUTPUT_FLUSH_SECONDS = env_int("LOOPSWEB_OUTPUT_FLUSH_SECONDS", 5)
# Loop-level retries (--max-attempts): the delay doubles per failed attempt up to this cap.
LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS = env_int("LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS", 3600)
# An item re-dispatched (a loop retry, an exit 75 "try later") more than this many times
# since its last admission is dead-lettered instead; rate-limit waits never count.
LOOPSWEB_MAX_REDISPATCH = env_int("LOOPSWEB_MAX_REDISPATCH", 8)
# --- end runner ---

# --- isolation ---
# Where agents may run (runs.projects, runs.worktrees; docs/operations.md "Isolation").


def _absolute_dirs(name: str, raw: list[str]) -> tuple[str, ...]:
    # No `~` expansion and no relative paths: a root is exactly the directory named.
    for part in raw:
        if not os.path.isabs(part) or "\x00" in part:
            raise ImproperlyConfigured(f"{name} must list absolute paths, got {part!r}")
    return tuple(os.path.normpath(part) for part in raw)


# Directories project paths must resolve into (symlinks followed). Empty: no agent runs.
LOOPSWEB_PROJECT_ROOTS = _absolute_dirs(
    "LOOPSWEB_PROJECT_ROOTS", env_list("LOOPSWEB_PROJECT_ROOTS", [])
)
# Per-run git worktrees live here, one directory per run.
_worktree_dir = env_str("LOOPSWEB_WORKTREE_DIR")
if _worktree_dir and not os.path.isabs(_worktree_dir):
    raise ImproperlyConfigured(
        f"LOOPSWEB_WORKTREE_DIR must be an absolute path, got {_worktree_dir!r}"
    )
LOOPSWEB_WORKTREE_DIR = os.path.normpath(_worktree_dir or str(DATA_DIR / "worktrees"))
# A failed run's worktree is kept this long for an operator to look at, then pruned.
LOOPSWEB_WORKTREE_KEEP_SECONDS = env_int(
    "LOOPSWEB_WORKTREE_KEEP_SECONDS", 3 * 24 * 3600
)
# The git binary that creates and removes worktrees (a name on PATH or an absolute path).
LOOPSWEB_GIT_BIN = env_str("LOOPSWEB_GIT_BIN") or "git"
# Delivery of a run's work (docs/delivery.md): the commits' author and committer, the
# forge's API, the file holding its token (a 0600 env file, a GITHUB_TOKEN= line) and the
# console's address for links in a pull request.
LOOPSWEB_GIT_AUTHOR = env_str("LOOPSWEB_GIT_AUTHOR") or "loopsweb <loopsweb@localhost>"
try:
    parse_git_author(LOOPSWEB_GIT_AUTHOR)
except ValueError as _exc:
    raise ImproperlyConfigured(str(_exc)) from None
LOOPSWEB_GITHUB_API_URL = (
    env_str("LOOPSWEB_GITHUB_API_URL") or "https://api.github.com"
).rstrip("/")
if not re.match(r"^https?://[^\s/]+", LOOPSWEB_GITHUB_API_URL):
    raise ImproperlyConfigured("LOOPSWEB_GITHUB_API_URL must be an http(s) URL")
LOOPSWEB_GITHUB_TOKEN_FILE = env_str("LOOPSWEB_GITHUB_TOKEN_FILE") or None
# GitHub webhooks (docs/revisions.md): the secret they are signed with, a 0600 env file with
# a GITHUB_WEBHOOK_SECRET= line (unset: POST /hooks/github/ answers 404); the quiet time that
# gathers a burst of reviews and checks into one revision; the largest payload taken.
LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE = (
    env_str("LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE") or None
)
LOOPSWEB_REVISION_DEBOUNCE_SECONDS = env_int("LOOPSWEB_REVISION_DEBOUNCE_SECONDS", 60)
# Whose reviews and review comments may send the work back (GitHub's author_association).
LOOPSWEB_GITHUB_TRUSTED_ASSOCIATIONS = env_list(
    "LOOPSWEB_GITHUB_TRUSTED_ASSOCIATIONS", ["OWNER", "MEMBER", "COLLABORATOR"]
)
LOOPSWEB_GITHUB_WEBHOOK_MAX_BYTES = env_int(
    "LOOPSWEB_GITHUB_WEBHOOK_MAX_BYTES", 4 * 1024 * 1024
)
LOOPSWEB_BASE_URL = env_str("LOOPSWEB_BASE_URL").rstrip("/")


def _notify_url(raw: str) -> str:
    # Never quoted back in the error: a webhook URL carries its token.
    if not raw:
        return ""
    try:
        parts = urlsplit(raw)
        good = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:
        good = False
    if not good or any(c.isspace() or ord(c) < 32 or 127 <= ord(c) < 160 for c in raw):
        raise ImproperlyConfigured(
            "LOOPSWEB_NOTIFY_URL must be an http:// or https:// URL with a host"
        )
    return raw


# Where episodes that need a human are posted (docs/operations.md "Notifications"): an
# http(s) URL taking one JSON message per episode (a Slack or Mattermost incoming webhook);
# unset: no notifications. It holds a secret (the webhook's token): never logged or shown.
LOOPSWEB_NOTIFY_URL = _notify_url(env_str("LOOPSWEB_NOTIFY_URL").strip())
# How a push reaches the remote: the operator's ssh command and credential helper (never a
# repository's config, which an agent can write); SSH_AUTH_SOCK is passed through.
LOOPSWEB_GIT_SSH_COMMAND = env_str("LOOPSWEB_GIT_SSH_COMMAND") or "ssh"
LOOPSWEB_GIT_CREDENTIAL_HELPER = env_str("LOOPSWEB_GIT_CREDENTIAL_HELPER")
LOOPSWEB_BRANCH_KEEP_SECONDS = env_int("LOOPSWEB_BRANCH_KEEP_SECONDS", 7 * 24 * 3600)
# How long a PR's state read from the forge is trusted by the review gate.
LOOPSWEB_PR_STATE_CACHE_SECONDS = env_int("LOOPSWEB_PR_STATE_CACHE_SECONDS", 60)


def _passthrough(name: str) -> tuple[str, ...]:
    # Names (or `PREFIX*` patterns) of worker variables an agent may also see. Naming one of
    # loopsweb's own settings is refused here; the runner drops them whatever a pattern says.
    names = tuple(env_list(name, []))
    for entry in names:
        stem = entry[:-1] if entry.endswith("*") else entry
        if not stem or not all(c.isalnum() or c == "_" for c in stem):
            raise ImproperlyConfigured(
                f"{name} must list variable names or PREFIX* patterns, got {entry!r}"
            )
        if stem.startswith("LOOPSWEB_") or stem in ("DATABASE_URL", "SECRET_KEY"):
            raise ImproperlyConfigured(
                f"{name} may not pass loopsweb's own settings to agents, got {entry!r}"
            )
    return names


LOOPSWEB_AGENT_ENV_PASSTHROUGH = _passthrough("LOOPSWEB_AGENT_ENV_PASSTHROUGH")

# The sandbox of every agent step (runs.sandbox, docs/isolation.md §7): `bwrap` (bubblewrap,
# the default) or `off` (agents run unsandboxed, with a red banner on every operator page).
LOOPSWEB_AGENT_SANDBOX = (env_str("LOOPSWEB_AGENT_SANDBOX") or "bwrap").strip()
if LOOPSWEB_AGENT_SANDBOX not in ("bwrap", "off"):
    raise ImproperlyConfigured(
        f"LOOPSWEB_AGENT_SANDBOX must be bwrap or off, got {LOOPSWEB_AGENT_SANDBOX!r}"
    )
# Paths bound into every step's sandbox at the same path, read-write and read-only (a shared
# package cache, say); one that would expose loopsweb's data, checkout or an account's login is
# refused when a step would start (runs.sandbox.operator_bind_problem).
LOOPSWEB_AGENT_SANDBOX_BIND = _absolute_dirs(
    "LOOPSWEB_AGENT_SANDBOX_BIND", env_list("LOOPSWEB_AGENT_SANDBOX_BIND", [])
)
LOOPSWEB_AGENT_SANDBOX_RO_BIND = _absolute_dirs(
    "LOOPSWEB_AGENT_SANDBOX_RO_BIND", env_list("LOOPSWEB_AGENT_SANDBOX_RO_BIND", [])
)
# Hosts a sandboxed step may reach besides its account's endpoints: `host[:port]`, `*.domain`.
_EGRESS_RULE = re.compile(
    r"^(\*\.)?[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:]+\](:[0-9]{1,5})?$"
)
LOOPSWEB_AGENT_EGRESS_ALLOW = tuple(env_list("LOOPSWEB_AGENT_EGRESS_ALLOW", []))
for _rule in LOOPSWEB_AGENT_EGRESS_ALLOW:
    if not _EGRESS_RULE.match(_rule):
        raise ImproperlyConfigured(
            f"LOOPSWEB_AGENT_EGRESS_ALLOW must list host[:port] patterns, got {_rule!r}"
        )
# --- end isolation ---
