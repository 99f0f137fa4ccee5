"""Every numeric setting has a row in the bounds table and is refused past it (issue 28, 4).

A value such as 99999999999999 seconds used to pass `check` and overflow later (timedelta,
the clock, the database). Now start-up stops with ImproperlyConfigured naming the variable.
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

from domain.bounds import BOUNDS
from tests.processes import manage

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = sorted((ROOT / "loopsweb" / "settings").glob("*.py"))  # the settings package
HUGE = "99999999999999"


def _env_int_names() -> list[str]:
    """The variables the settings read with env_int (read from their source, not imported)."""
    names = []
    trees = [ast.parse(path.read_text()) for path in SETTINGS]
    for node in (node for tree in trees for node in ast.walk(tree)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "env_int"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.append(node.args[0].value)
    return names


# `manage.py check` with no DATABASE_URL: a database of its own, never the suite's.
pytestmark = pytest.mark.own_database


def _check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`manage.py check` in a clean environment plus `env`."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}
        and not k.startswith("LOOPSWEB_")
        and not k.startswith("Q_")
    }
    base.update(LOOPSWEB_DATA_DIR=str(tmp_path), SECRET_KEY="x" * 50, **env)
    return manage(base, "check", check=False)


def test_every_numeric_setting_has_a_row_in_the_bounds_table() -> None:
    names = _env_int_names()
    assert "LOOPSWEB_WORKTREE_KEEP_SECONDS" in names and "Q_TIMEOUT" in names
    assert [n for n in names if n not in BOUNDS] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "maximum"),
    [
        ("LOOPSWEB_WORKTREE_KEEP_SECONDS", 10 * 365 * 86400),
        ("LOOPSWEB_RUN_LEASE_SECONDS", 86400),
        ("LOOPSWEB_COOLDOWN_CAP_SECONDS", 30 * 86400),
        ("LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS", 7 * 86400),
        ("LOOPSWEB_STEP_START_POLL_SECONDS", 3600),
        ("LOOPSWEB_KILL_GRACE_SECONDS", 3600),
        ("Q_TIMEOUT", 7 * 86400),
    ],
)
def test_a_setting_past_its_bound_stops_check_naming_the_variable(
    tmp_path: Path, name: str, maximum: int
) -> None:
    env = {name: HUGE}
    if name == "Q_TIMEOUT":
        env["Q_RETRY"] = HUGE + "9"
    result = _check(tmp_path, **env)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"django.core.exceptions.ImproperlyConfigured: {name} must be at most "
        f"{maximum}, got '{HUGE}'"
    )


@pytest.mark.slow
def test_a_5000_digit_setting_is_refused_without_converting_it(tmp_path: Path) -> None:
    result = _check(tmp_path, LOOPSWEB_DRAIN_BATCH_SIZE="9" * 5000)
    assert result.returncode != 0
    assert "LOOPSWEB_DRAIN_BATCH_SIZE must be at most 10000" in result.stderr
    assert "ValueError" not in result.stderr  # not int()'s digit limit


@pytest.mark.slow
def test_a_setting_at_its_bound_passes_check(tmp_path: Path) -> None:
    result = _check(
        tmp_path,
        LOOPSWEB_WORKTREE_KEEP_SECONDS=str(10 * 365 * 86400),
        LOOPSWEB_MAX_EVENT_BYTES="1024",
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_a_setting_below_a_minimum_over_one_names_the_minimum(tmp_path: Path) -> None:
    result = _check(tmp_path, LOOPSWEB_MAX_EVENT_BYTES="5")
    assert result.returncode != 0
    assert "LOOPSWEB_MAX_EVENT_BYTES must be >= 1024, got '5'" in result.stderr
