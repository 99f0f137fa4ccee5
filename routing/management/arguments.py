"""Command-line options shared by `route_event`, `drain` and `schedule_drain`.

Limits are parsed as text and validated by `routing.admission.checked_route_options`, so every
entry point (argv, schedules, the API) reports bad values with the same upstream message.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from domain.errors import ROUTE_KIND_INVALID, ValidationError
from domain.keys import KINDS
from routing.admission import OPTION_NAMES, RouteOptions, checked_route_options


def add_route_arguments(parser: argparse.ArgumentParser) -> None:
    """The route options, then --dry-run and --json, in the order --help lists them."""
    _add_account_arguments(parser)
    _add_scope_arguments(parser)
    _add_sandbox_arguments(parser)
    _add_pool_guard_arguments(parser)
    _add_run_arguments(parser)
    _add_delivery_arguments(parser)
    add = parser.add_argument
    add("--dry-run", action="store_true", help="decide and report, write nothing")
    add("--json", action="store_true", help="print one JSON object")


def _add_account_arguments(parser: argparse.ArgumentParser) -> None:
    """The template, the provider, and the accounts each role runs as."""
    add = parser.add_argument
    add(
        "--template",
        help="todos-task-worker-verifier (default) or task-lifecycle; generic: event-worker-verifier",
    )
    add(
        "--provider",
        help="agent provider (default codewith); a pool routes with codewith, or when "
        "every pool member is a registered account of this provider",
    )
    add("--auth-profile", help="the account for every role when no pool or pin applies")
    add(
        "--auth-profile-pool",
        help="comma-separated account pool (least-loaded per role)",
    )
    for role in ("triage", "planner", "worker", "verifier"):
        add(
            f"--{role}-auth-profile",
            help=f"pin the {role} role to one account (disables pool routing)",
        )


def _add_scope_arguments(parser: argparse.ArgumentParser) -> None:
    """The caps on active items, their scope, and the project of the routed work."""
    add = parser.add_argument
    add("--max-active", help="cap on active items in this route scope")
    add(
        "--max-active-scope",
        help="scope key for --max-active (default: $LOOPS_LOOP_NAME, else the route key)",
    )
    add(
        "--max-active-per-project",
        help="cap on active items per project, across routes",
    )
    add(
        "--max-active-per-project-group",
        help="cap on active items per project group, across routes",
    )
    add("--project-group", help="project group of the routed work")
    add(
        "--project-path",
        help="absolute project path when the event names none (inside LOOPSWEB_PROJECT_ROOTS)",
    )


def _add_sandbox_arguments(parser: argparse.ArgumentParser) -> None:
    """Where and how the agents run: worktree, sandbox, break-glass."""
    add = parser.add_argument
    add(
        "--worktree-mode",
        help="off, auto (default: a git worktree per run when the project is a git work tree) or required",
    )
    add(
        "--sandbox",
        help="agent sandbox: read-only, workspace-write (default) or danger-full-access",
    )
    add(
        "--manual-break-glass",
        action="store_true",
        help="record manual break-glass evidence (lets --sandbox danger-full-access pass the preflight)",
    )


def _add_pool_guard_arguments(parser: argparse.ArgumentParser) -> None:
    """When a pool account is too busy to take more."""
    add = parser.add_argument
    add(
        "--max-per-profile",
        help="defer when every pool account carries this many steps (default 2; 0 disables)",
    )
    add(
        "--max-window-used",
        help="defer a pool account once a rate-limit window is this used (0..1, default "
        "0.9), or off: ignore the windows (the least-loaded rule alone)",
    )


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The run's names, attempts and step timeouts."""
    add = parser.add_argument
    add("--name-prefix", help="prefix of generated workflow and loop names")
    add(
        "--max-attempts",
        help="runs per admission: a failed or timed-out run is retried until this many (default 1)",
    )
    add(
        "--retry-backoff",
        help="delay before the first retry (30, 30s, 5m, 1h; default 60s), doubled per "
        "further failure up to LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS",
    )
    add(
        "--step-timeout",
        help="seconds each agent step may run in total "
        "(default LOOPSWEB_STEP_TIMEOUT_SECONDS, 3600)",
    )
    add(
        "--step-idle-timeout",
        help="seconds each agent step may print nothing "
        "(default LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS, 600)",
    )


def _add_delivery_arguments(parser: argparse.ArgumentParser) -> None:
    """What becomes of the run's work: branch, push, pull request, reviewers."""
    add = parser.add_argument
    add(
        "--deliver",
        help="what becomes of the run's work: none, branch (default: kept on "
        "loopsweb/run-<id>), push, pull-request",
    )
    add("--deliver-remote", help="the git remote pushed to (default origin)")
    add(
        "--deliver-failed",
        action="store_true",
        help="deliver a run whose verifier did not succeed too (a draft pull request)",
    )
    add(
        "--github-repo",
        help="OWNER/NAME of the pull request when the remote's URL is not a GitHub one",
    )
    add(
        "--github-reviewer-pool",  # upstream's other name; the last is the one shown
        "--github-reviewer",
        dest="github_reviewer",
        metavar="LOGIN[,LOGIN]",
        help="GitHub logins asked to review the pull request a pull-request delivery "
        "opens, and the reviewers the PR review gate may choose from (upstream's "
        "--github-reviewer-pool is the same option)",
    )
    add(
        "--max-revisions",
        help="rounds an item may be sent back for (the verifier's VERDICT: changes, a "
        "review, a failing check) before a human is asked (default 2; 0: off)",
    )


def add_drain_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--max-dispatch",
        help="stop after this many created admissions (default 1: a drain admits one "
        "item unless you raise it)",
    )
    add("--limit", help="most candidates considered (default 50)")
    add(
        "--scan-limit",
        help="most source rows read (default: limit, or max(limit, 500) with filters/inbox)",
    )
    add("--tags", help="comma list: only candidates carrying all these tags")
    add(
        "--project-path-prefix",
        help="only candidates whose project is this path or under it",
    )
    add("--source", help="inbox (default) or command")
    add(
        "--source-command",
        help="argv printing a JSON array of tasks (`todos --json ready` shape)",
    )
    add(
        "--source-timeout",
        help="seconds before the source command is killed (default 60)",
    )
    add("--evidence-dir", help="also write the full report as a private JSON file here")
    add("--compact", action="store_true", help="compact per-item results")
    add(
        "--record-dry-run",
        action="store_true",
        help="store a drain record even for --dry-run",
    )


def drain_options_from_argparse(
    kind: str, options: dict[str, Any], *, name: str | None = None
) -> Any:
    from routing.drains import DRAIN_OPTION_NAMES, drain_options

    if kind not in KINDS:
        raise CommandError(ROUTE_KIND_INVALID)
    raw = {
        k: options.get(k)
        for k in (*OPTION_NAMES, *DRAIN_OPTION_NAMES)
        if options.get(k) not in (None, False)
    }
    raw["dry_run"] = bool(options.get("dry_run"))
    try:
        return drain_options(kind, raw, name=name)
    except ValidationError as exc:
        raise CommandError(str(exc)) from None


def options_from_argparse(kind: str, options: dict[str, Any]) -> RouteOptions:
    raw = {
        name: options.get(name)
        for name in OPTION_NAMES
        if options.get(name) is not None
    }
    raw["dry_run"] = bool(options.get("dry_run"))
    try:
        return checked_route_options(kind, raw, env=os.environ)
    except ValidationError as exc:
        raise CommandError(str(exc)) from None


def read_limited(stream: Any, limit: int, what: str) -> str:
    """Read at most `limit` bytes; more is an error (nothing is half-read into the ledger)."""
    data = stream.read(limit + 1)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if len(data) > limit:
        raise CommandError(
            f"{what} is larger than {limit} bytes (LOOPSWEB_MAX_EVENT_BYTES)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CommandError(f"{what} is not valid UTF-8") from None


def read_event_text(
    *, event_file: str | None, event_json: str | None, stdin: Any = None
) -> str:
    limit = settings.LOOPSWEB_MAX_EVENT_BYTES
    if event_json is not None:
        if len(event_json.encode("utf-8", "surrogateescape")) > limit:
            raise CommandError(
                f"--event-json is larger than {limit} bytes (LOOPSWEB_MAX_EVENT_BYTES)"
            )
        return event_json
    if event_file and event_file != "-":
        try:
            with open(event_file, "rb") as handle:
                return read_limited(handle, limit, event_file)
        except OSError as exc:
            raise CommandError(
                f"cannot read --event-file {event_file}: {exc.strerror}"
            ) from None
    if not event_file and os.environ.get("HASNA_EVENT_JSON"):
        return os.environ["HASNA_EVENT_JSON"]
    stream = stdin if stdin is not None else sys.stdin
    return read_limited(getattr(stream, "buffer", stream), limit, "stdin")
