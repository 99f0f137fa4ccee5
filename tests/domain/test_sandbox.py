"""The sandbox preflight (docs/upstream.md §3.3) and the isolation options, without a database."""

from __future__ import annotations

from typing import Any

import pytest

from domain.errors import ValidationError
from domain.sandbox import (
    break_glass_allowlist,
    parse_sandbox,
    parse_worktree_mode,
    sandbox_preflight,
    worktree_enabled,
)


def _step(provider: str, sandbox: str | None, **target: Any) -> dict[str, Any]:
    return {
        "id": "worker",
        "target": {"type": "agent", "provider": provider, "sandbox": sandbox, **target},
    }


@pytest.mark.parametrize(
    ("provider", "sandbox"),
    [
        ("codewith", "workspace-write"),
        ("codewith", "read-only"),
        ("codex", "workspace-write"),
        ("codex", "read-only"),
        ("cursor", "enabled"),
    ],
)
def test_a_provider_sandbox_passes_without_a_worktree(
    provider: str, sandbox: str
) -> None:
    assert sandbox_preflight([_step(provider, sandbox)], worktree=False) == [
        {"stepId": "worker", "method": "provider-native-sandbox"}
    ]


@pytest.mark.parametrize("provider", ["claude", "opencode", "aicopilot", "cursor"])
def test_a_provider_without_its_own_sandbox_needs_the_worktree(provider: str) -> None:
    step = _step(provider, "workspace-write")
    assert sandbox_preflight([step], worktree=True)[0]["method"] == (
        "isolated-worktree"
    )
    with pytest.raises(ValidationError) as refused:
        sandbox_preflight([step], worktree=False)
    assert str(refused.value) == (
        "route step worker has no verified unattended isolation; use provider sandbox "
        "workspace-write/read-only/enabled, worktreeMode=required, or explicit manual "
        "break-glass"
    )


def test_danger_full_access_needs_the_break_glass_marker_even_with_a_worktree() -> None:
    for provider in ("codewith", "claude"):
        with pytest.raises(ValidationError) as refused:
            sandbox_preflight([_step(provider, "danger-full-access")], worktree=True)
        assert str(refused.value) == (
            "route step worker uses danger-full-access without manual break-glass evidence"
        )
        marked = _step(
            provider, "danger-full-access", allowlist=break_glass_allowlist()
        )
        assert sandbox_preflight([marked], worktree=False)[0]["method"] == (
            "manual-break-glass"
        )


def test_steps_that_are_not_agents_are_not_checked() -> None:
    command = {"id": "build", "target": {"type": "command", "command": "make"}}
    assert sandbox_preflight([command], worktree=False) == []


def test_worktree_enabled_follows_the_mode() -> None:
    assert worktree_enabled("required", git_work_tree=False)
    assert worktree_enabled("auto", git_work_tree=True)
    assert not worktree_enabled("auto", git_work_tree=False)
    assert not worktree_enabled("off", git_work_tree=True)


def test_options_default_and_refuse_unknown_values() -> None:
    assert parse_sandbox(None) == "workspace-write"
    assert parse_worktree_mode("") == "auto"
    assert parse_worktree_mode(" required ") == "required"
    with pytest.raises(
        ValidationError, match="--worktree-mode must be off, auto or required"
    ):
        parse_worktree_mode("main")
    with pytest.raises(ValidationError, match="--sandbox must be"):
        parse_sandbox(True)
