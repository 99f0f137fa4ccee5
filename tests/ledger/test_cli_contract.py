"""The provider adapters against the real agent CLIs, installed from the npm registry.

Pinned versions (tests/agents/clis.py `CLI_PACKAGES`) are installed once into a cache
directory (`LOOPSWEB_CLI_CACHE_DIR`, default `~/.cache/loopsweb/cli-contract`), then for
codex, claude and opencode:
1. every flag and subcommand the adapter passes exists in that version's `--help`;
2. the prompt cannot be read as a flag: the CLI is started with the adapter's argv and the
   prompt `--version`, in an empty home (no login), and must not answer with its version:
   its first line decides (a flag's answer comes first), and the CLI is stopped there.
cursor-agent is not published on npm (the npm package of that name is unrelated), so it is
not checked here. The test is skipped, with the reason printed, only where `npm` is absent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from pytest_django import Settings

from agents.providers import ADAPTERS
from runs.providers import agent_invocation
from tests.agents.clis import CLI_PACKAGES, install_clis
from tests.waiting import hang_deadline

# Where each adapter's flags are documented: the help of its subcommand.
HELP_ARGV = {
    "codex": ["exec", "--help"],
    "claude": ["--help"],
    "opencode": ["run", "--help"],
}

# One worker runs the module: its npm cache directory is shared, filled once per module. The
# module reads no database, so it runs in one suite (SQLite's), not again on PostgreSQL.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.sqlite,
    pytest.mark.xdist_group("agent_clis"),
]


@pytest.fixture(scope="module")
def cli_bin() -> Path:
    return install_clis("test_cli_contract")


def _first_line(proc: subprocess.Popen[str]) -> str:
    """What `proc` printed up to its first line that is not blank (all it printed, when it
    ended first); fails when it neither prints nor ends within a hang deadline."""
    assert proc.stdout is not None
    stdout = proc.stdout
    seen: list[str] = []

    def read() -> None:
        for line in stdout:
            seen.append(line)
            if line.strip():
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(hang_deadline(120))
    assert not reader.is_alive(), "the CLI printed nothing and did not end"
    return "".join(seen)


def _empty_home(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_STATE_HOME": str(home / "state"),
        "NO_COLOR": "1",
    }


def _argv(provider: str, binary: Path, prompt: str, settings: Settings) -> list[str]:
    settings.LOOPSWEB_PROVIDER_BINARIES = {provider: str(binary)}
    invocation = agent_invocation(
        target={
            "provider": provider,
            "prompt": prompt,
            "sandbox": "workspace-write",
            "cwd": str(Path.home()),
        },
        profile=None,
        tool=None,
        run_id="r",
        step_id="s",
    )
    return invocation.argv


# Flags whose value is loopsweb's own text, not one the help lists (opencode's session title).
FREE_VALUES = {"--title"}


@pytest.mark.parametrize("provider", sorted(CLI_PACKAGES))
def test_every_flag_the_adapter_passes_is_in_the_clis_help(
    provider: str, cli_bin: Path, tmp_path: Path, settings: Settings
) -> None:
    binary = cli_bin / CLI_PACKAGES[provider][2]
    version = subprocess.run(
        [str(binary), "--version"],
        cwd=tmp_path,  # a CLI's stray file lands here, never in the checkout
        capture_output=True,
        text=True,
        timeout=120,
        env=_empty_home(tmp_path),
    )
    assert CLI_PACKAGES[provider][1] in version.stdout + version.stderr
    top = subprocess.run(
        [str(binary), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_empty_home(tmp_path),
    )
    help_text = subprocess.run(
        [str(binary), *HELP_ARGV[provider]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_empty_home(tmp_path),
    )
    text = help_text.stdout + help_text.stderr
    argv = _argv(provider, binary, "fix the build", settings)
    options = argv[1 : argv.index("--")]
    adapter = ADAPTERS[provider]
    for before, item in zip(["", *options], options, strict=False):
        if item.startswith("-"):
            assert item in text, (
                f"{provider} {CLI_PACKAGES[provider][1]}: no {item} in help"
            )
        elif item in adapter.leading and before not in FREE_VALUES:
            # A subcommand (top-level help) or the value of a flag (the subcommand's).
            assert item in top.stdout + top.stderr + text, (
                f"{provider}: no subcommand or value {item}"
            )
    # The value the adapter gives --output-format / --sandbox is one the help lists.
    if "--output-format" in options:
        assert '"json"' in text or "json" in text
    if "--sandbox" in options:
        assert "workspace-write" in text
    if "--permission-mode" in options:
        mode = options[options.index("--permission-mode") + 1]
        assert mode in text, f"{provider}: no permission mode {mode} in help"


@pytest.mark.parametrize("provider", sorted(CLI_PACKAGES))
def test_the_prompt_is_never_read_as_a_flag(
    provider: str, cli_bin: Path, tmp_path: Path, settings: Settings
) -> None:
    package, version, name = CLI_PACKAGES[provider]
    argv = _argv(provider, cli_bin / name, "--version", settings)
    workdir = tmp_path / "work"
    workdir.mkdir()
    proc = subprocess.Popen(
        argv,
        cwd=workdir,
        env=_empty_home(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    # The first line decides: a CLI that reads `--version` as its flag prints its version
    # first and exits; one that takes it as the prompt prints something else first (an
    # error, its log) and may go on (opencode retries its default provider for minutes).
    try:
        first = _first_line(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # it and everything it started
        rest, _ = proc.communicate()
    output = first + rest
    assert output.strip(), f"{package}@{version} printed nothing"
    # `--version` read as a flag prints one short line holding the version (codex
    # "codex-cli-exec 0.171.0", claude "2.1.197 (Claude Code)", opencode "1.18.33").
    answered = [
        line
        for line in output.splitlines()
        if version in line and len(line.strip()) < 40
    ]
    assert not answered, f"{package}@{version} read the prompt as a flag: {answered}"
