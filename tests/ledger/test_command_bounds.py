"""Numeric options of the other commands use the bounds table too (issue 28, 4).

`prune_worktrees --keep-seconds 99999999999999999999` used to reach timedelta() and die with
OverflowError; every numeric option is now parsed by domain.bounds before `handle` runs.
"""

from __future__ import annotations

import os

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.processes import manage

pytestmark = pytest.mark.django_db
HUGE = "99999999999999999999"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["prune_worktrees", "--keep-seconds", HUGE],
            "--keep-seconds must be at most 315360000",
        ),
        (["prune_worktrees", "--keep-seconds", "-1"], "--keep-seconds must be a non"),
        (
            ["prune_drains", "--days", HUGE],
            "--days must be at most 36500",
        ),
        (["prune_drains", "--days", "0"], "--days must be a positive integer"),
        (
            ["account", "add", "a1", "--provider", "codewith", "--max-running", HUGE],
            "--max-running must be at most 100000",
        ),
        (["loop", "list", "--limit", HUGE], "--limit must be at most 1000"),
        (["loop", "list", "--limit", "9" * 5000], "--limit must be at most 1000"),
    ],
)
def test_a_numeric_option_past_its_bound_is_one_clear_error(
    argv: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        call_command(*argv)


@pytest.mark.slow
def test_prune_worktrees_with_a_huge_keep_is_one_line_and_exit_2(tmp_path) -> None:
    done = manage(
        dict(os.environ), "prune_worktrees", "--keep-seconds", HUGE, check=False
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("--keep-seconds must be at most 315360000")
    )
