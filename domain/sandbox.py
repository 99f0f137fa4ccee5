"""Agent isolation: the sandbox preflight (docs/upstream.md §3.3) and the worktree/sandbox options.

Contract:
1. ``--sandbox`` is ``read-only``, ``workspace-write`` (default) or ``danger-full-access``;
   ``--worktree-mode`` is ``off``, ``auto`` (default, upstream's policy) or ``required``.
2. Every agent step must be isolated, checked in this order (first match decides):
   a. ``danger-full-access`` needs the ``manual-break-glass`` allowlist marker, else
      ``DANGER_WITHOUT_BREAK_GLASS``; with it the step passes as ``manual-break-glass``;
   b. codewith/codex with ``workspace-write``/``read-only``, or cursor with ``enabled``,
      pass as ``provider-native-sandbox``;
   c. otherwise an enabled worktree (mode ``required``, or ``auto`` on a git work tree)
      passes as ``isolated-worktree``;
   d. otherwise ``NO_ISOLATION``.
3. Admission runs it before any write; the runner runs it again when a generated step
   starts, against the worktree the run actually got.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from domain.errors import ValidationError

READ_ONLY = "read-only"
WORKSPACE_WRITE = "workspace-write"
DANGER_FULL_ACCESS = "danger-full-access"
SANDBOX_MODES = (READ_ONLY, WORKSPACE_WRITE, DANGER_FULL_ACCESS)
DEFAULT_SANDBOX = WORKSPACE_WRITE

WORKTREE_OFF = "off"
WORKTREE_AUTO = "auto"
WORKTREE_REQUIRED = "required"
WORKTREE_MODES = (WORKTREE_OFF, WORKTREE_AUTO, WORKTREE_REQUIRED)
DEFAULT_WORKTREE_MODE = WORKTREE_AUTO

BREAK_GLASS = "manual-break-glass"
PROVIDER_NATIVE = "provider-native-sandbox"
ISOLATED_WORKTREE = "isolated-worktree"

# Providers whose own sandbox upstream trusts, and the sandbox values that count.
NATIVE_SANDBOXES: dict[str, frozenset[str]] = {
    "codewith": frozenset({WORKSPACE_WRITE, READ_ONLY}),
    "codex": frozenset({WORKSPACE_WRITE, READ_ONLY}),
    "cursor": frozenset({"enabled"}),
}

SANDBOX_INVALID = "--sandbox must be read-only, workspace-write or danger-full-access"
WORKTREE_MODE_INVALID = "--worktree-mode must be off, auto or required"
DANGER_WITHOUT_BREAK_GLASS = (
    "route step {step_id} uses danger-full-access without manual break-glass evidence"
)
NO_ISOLATION = (
    "route step {step_id} has no verified unattended isolation; use provider sandbox "
    "workspace-write/read-only/enabled, worktreeMode=required, or explicit manual break-glass"
)


def parse_sandbox(value: object) -> str:
    if value is None or value == "":
        return DEFAULT_SANDBOX
    if not isinstance(value, str) or value.strip() not in SANDBOX_MODES:
        raise ValidationError(SANDBOX_INVALID)
    return value.strip()


def parse_worktree_mode(value: object) -> str:
    if value is None or value == "":
        return DEFAULT_WORKTREE_MODE
    if not isinstance(value, str) or value.strip() not in WORKTREE_MODES:
        raise ValidationError(WORKTREE_MODE_INVALID)
    return value.strip()


def break_glass_allowlist() -> dict[str, Any]:
    """The allowlist an agent target carries when an operator broke the glass (upstream)."""
    return {"enforcement": "metadata_only", "commands": [BREAK_GLASS]}


def _has_break_glass(target: Mapping[str, Any]) -> bool:
    allowlist = target.get("allowlist")
    if not isinstance(allowlist, dict):
        return False
    commands = allowlist.get("commands")
    return isinstance(commands, list) and BREAK_GLASS in commands


def worktree_enabled(mode: str | None, *, git_work_tree: bool) -> bool:
    """Whether a run in `mode` gets its own worktree for a project (``git_work_tree``)."""
    return mode == WORKTREE_REQUIRED or (mode == WORKTREE_AUTO and git_work_tree)


def step_isolation(step: Mapping[str, Any], *, worktree: bool) -> str | None:
    """How an agent step is isolated (module docstring, "every agent step must be
    isolated"); None for a step that is not an agent.

    Raises ValidationError with upstream's message when it is not isolated at all.
    """
    target = step.get("target")
    if not isinstance(target, dict) or target.get("type") != "agent":
        return None
    step_id = step.get("id")
    sandbox = target.get("sandbox")
    if sandbox == DANGER_FULL_ACCESS:
        if _has_break_glass(target):
            return BREAK_GLASS
        raise ValidationError(DANGER_WITHOUT_BREAK_GLASS.format(step_id=step_id))
    if sandbox in NATIVE_SANDBOXES.get(str(target.get("provider")), frozenset()):
        return PROVIDER_NATIVE
    if worktree:
        return ISOLATED_WORKTREE
    raise ValidationError(NO_ISOLATION.format(step_id=step_id))


def sandbox_preflight(
    steps: Iterable[Mapping[str, Any]], *, worktree: bool
) -> list[dict[str, str]]:
    """Every agent step's isolation, ``[{"stepId", "method"}]``, or ValidationError for
    the first step that has none."""
    out = []
    for step in steps:
        isolation = step_isolation(step, worktree=worktree)
        if isolation is not None:
            out.append({"stepId": str(step.get("id")), "method": isolation})
    return out
