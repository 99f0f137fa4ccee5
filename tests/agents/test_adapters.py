"""What the adapters add so the real CLIs work headless (runs.providers.headless_options);
tests/agents/test_real_clis.py runs the CLIs with it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from ledger.services.accounts import account_add
from runs.providers import agent_invocation, in_git_work_tree
from tests.agents import clis


def _invocation(provider: str, cwd: Path, sandbox: str, profile: str | None = None):
    return agent_invocation(
        target={
            "provider": provider,
            "prompt": "p",
            "sandbox": sandbox,
            "cwd": str(cwd),
        },
        profile=profile,
        tool=provider,
        run_id="r",
        step_id="s",
    )


@pytest.fixture(autouse=True)
def _binaries(settings: Any) -> None:
    settings.LOOPSWEB_PROVIDER_BINARIES = {p: "/bin/true" for p in clis.CLI_PACKAGES}
    settings.LOOPSWEB_AGENT_MAX_RETRIES = 2


@pytest.mark.django_db
@pytest.mark.slow
def test_codex_outside_a_git_tree_skips_the_check_and_bounds_its_custom_providers_retries(
    tmp_path: Path,
) -> None:
    home = clis.codex_home(tmp_path / "codex", "http://127.0.0.1:9", "K")
    account_add(name="cx", provider="codex", env={"CODEX_HOME": str(home)})
    # Outside any work tree: a directory of its own under the system's temporary directory,
    # not under the suite's base directory, which is also the tests' project root. (A real
    # codex in its workspace-write sandbox creates /tmp/.git while it runs; the suite's codex
    # homes turn /tmp off as a writable root, tests/agents/clis.py codex_home.)
    plain = Path(tempfile.mkdtemp(prefix="loopsweb-plain-"))
    try:
        assert not in_git_work_tree(str(plain)), plain
        argv = _invocation("codex", plain, "workspace-write", "cx").argv
    finally:
        plain.rmdir()
    assert argv[1:5] == ["exec", "--json", "--sandbox", "workspace-write"]
    assert "--skip-git-repo-check" in argv
    assert "check_for_update_on_startup=false" in argv
    assert "analytics.enabled=false" in argv
    assert argv[argv.index("--") - 4 : argv.index("--")] == [
        "-c",
        "model_providers.stub.stream_max_retries=2",
        "-c",
        "model_providers.stub.request_max_retries=2",
    ]
    repo = clis.git_repo(tmp_path / "repo")
    (repo / "sub").mkdir()
    assert "--skip-git-repo-check" not in _invocation("codex", repo / "sub", "x").argv
    # The built-in provider cannot be overridden (codex refuses): no -c at all.
    (home / "config.toml").write_text('model = "o3"\n')
    argv = _invocation("codex", repo, "workspace-write", "cx").argv
    assert not [item for item in argv if "max_retries" in item]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("sandbox", "mode", "edit"),
    [
        ("read-only", "plan", "deny"),
        ("workspace-write", "acceptEdits", "allow"),
        ("danger-full-access", "bypassPermissions", "allow"),
    ],
)
def test_the_sandbox_picks_claudes_permission_mode_and_opencodes_permissions(
    tmp_path: Path, sandbox: str, mode: str, edit: str
) -> None:
    claude = _invocation("claude", tmp_path, sandbox)
    assert claude.argv[1:7] == [
        "--print",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        mode,
    ]
    assert claude.env["CLAUDE_CODE_MAX_RETRIES"] == "2"
    for name in (
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "DISABLE_AUTOUPDATER",
        "DISABLE_ERROR_REPORTING",
    ):
        assert claude.env[name] == "1"
    opencode = _invocation("opencode", tmp_path, sandbox)
    assert opencode.argv[1:7] == [
        "run",
        "--format",
        "json",
        "--print-logs",
        "--log-level",
        "WARN",
    ]
    assert f'"edit":"{edit}"' in opencode.env["OPENCODE_PERMISSION"]
    assert opencode.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"
    assert opencode.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"


@pytest.mark.django_db
@pytest.mark.parametrize("provider", clis.REAL_CLIS)
def test_the_agents_pwd_is_its_working_directory_whatever_is_passed_through(
    provider: str,
    tmp_path: Path,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # opencode works in $PWD, not in its working directory: a PWD passed through from the
    # cluster would have it write outside the run.
    monkeypatch.setenv("PWD", "/")
    settings.LOOPSWEB_AGENT_ENV_PASSTHROUGH = ["PWD", "FAKE_AGENT_*"]
    invocation = _invocation(provider, tmp_path, "workspace-write")
    assert invocation.cwd == str(tmp_path)
    assert invocation.env["PWD"] == str(tmp_path)
