"""The real codex CLI as a hostile agent (issue 38): the provider stand-in's tool call plants
`core.fsmonitor` (in the project's shared config and in a repository of the agent's own in
place of the worktree's `.git`), and loopsweb's git runs none of it.

Through the processes `make run` starts: `manage.py ingest_events` and `drain` in a second
terminal, the run cluster running the real codex (tests/agents/test_runs_real.py).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from ledger.models import RunStatus
from tests.agents.provider import ProviderStandIn
from tests.agents.real_runs import drain_and_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("agent_clis"),
]


def _inert_git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "git",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
            "-C",
            str(repo),
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": os.environ["PATH"], "GIT_CONFIG_GLOBAL": os.devnull},
    )


def test_codex_planting_core_fsmonitor_makes_loopsweb_run_nothing(
    cli_bin: Path, stand_in: ProviderStandIn, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    mark = tmp_path / "mark.sh"
    mark.write_text(f'#!/bin/sh\necho "$0 $*" >> {marks}\ncat\n')
    mark.chmod(0o755)
    q = shlex.quote(str(mark))
    # In the project's config (which every worktree shares) and in a repository of its
    # own in place of the `.git` file loopsweb made (codex refuses `rm -f`; a move does it).
    stand_in.tool_command = (
        f"git config core.fsmonitor {q}; "
        f"mv .git .git-was && git init -q . && git config core.fsmonitor {q}"
    )
    home = (
        tmp_path / "home"
    )  # no login profile of the machine's to run in codex's shell
    home.mkdir()
    # Unsandboxed (break-glass, as an operator may route it): codex's own sandbox mounts
    # `.git` read-only and keeps the project's config out of reach, so planting needs it off.
    run = drain_and_run(
        "codex",
        cli_bin,
        stand_in,
        tmp_path,
        removed=False,
        env_extra={"HOME": str(home)},
        drain_args=("--sandbox", "danger-full-access", "--manual-break-glass"),
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    project = tmp_path / "project"
    worktree = Path(run.worktree_path or "")
    # The attack landed: codex's tool call planted the setting somewhere loopsweb's git
    # would read it.
    planted = [
        where
        for where in (project, worktree)
        if (where / ".git").is_dir()
        and _inert_git(where, "config", "--local", "core.fsmonitor").stdout.strip()
        == str(mark)
    ]
    tool_outputs = [
        item.get("output")
        for request in stand_in.requests
        for item in (request.body or {}).get("input", [])
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert planted, f"codex's tool call planted nothing: {tool_outputs}"
    # loopsweb ran none of it.
    assert not marks.exists(), marks.read_text()
    branches = _inert_git(project, "branch", "--list", "--format=%(refname:short)")
    assert sorted(branches.stdout.split()) == sorted(["main", run.worktree_branch])
    if worktree in planted:
        # The worktree's .git is the agent's own repository: nothing committed, the work
        # kept where the run says.
        assert run.commit_error and str(worktree) in run.commit_error
        assert (worktree / stand_in.file_name).read_text() == stand_in.file_content
    else:
        shown = _inert_git(
            project, "show", f"{run.worktree_branch}:{stand_in.file_name}"
        )
        assert shown.stdout == stand_in.file_content
