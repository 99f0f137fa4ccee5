"""A damaged SQLite file: one clear line from every command and from runserver (issue 28, 6).

Real `manage.py` processes on a real migrated SQLite file with garbage written over it.
Before, commands died with a traceback ending in `database disk image is malformed` and
runserver printed one from its thread and stayed up serving nothing.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.processes import free_port, manage, terminal_env

pytestmark = [pytest.mark.slow, pytest.mark.sqlite]


def _env(data_dir: Path) -> dict[str, str]:
    env = terminal_env(data_dir)
    env.update(
        DATABASE_URL=f"sqlite:///{data_dir / 'loopsweb.sqlite3'}",
        SECRET_KEY="x" * 50,
        DJANGO_SETTINGS_MODULE="loopsweb.settings",
    )
    return env


def _damaged(
    tmp_path: Path, migrated_sqlite: Callable[[Path], Path], *, keep_header: bool
) -> tuple[dict[str, str], Path]:
    """A migrated file (`migrated_sqlite`: what these tests damage is the file, not the
    migration) with garbage over all of it or all but its first page."""
    data_dir = tmp_path / "data"
    env = _env(data_dir)
    db = migrated_sqlite(data_dir / "loopsweb.sqlite3")
    size = db.stat().st_size
    garbage = random.Random(28).randbytes(size)
    with db.open("r+b") as handle:
        if keep_header:  # the first page (header and schema root) survives
            handle.seek(4096)
            handle.write(garbage[4096:])
        else:
            handle.write(garbage)
    return env, db


def _one_clear_line(done: subprocess.CompletedProcess[str], db: Path) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("loopsweb: ")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"loopsweb: the SQLite database {db} is damaged (")
    assert "restore the file from a backup" in lines[0]


@pytest.mark.parametrize("keep_header", [True, False])
@pytest.mark.parametrize(
    "argv",
    [
        ["routes", "list"],
        ["drain", "generic", "--max-active", "1"],
        ["ingest_events", "-"],
        ["migrate", "--noinput"],
    ],
)
def test_a_command_on_a_damaged_file_says_so_in_one_line(
    tmp_path: Path,
    migrated_sqlite: Callable[[Path], Path],
    keep_header: bool,
    argv: list[str],
) -> None:
    env, db = _damaged(tmp_path, migrated_sqlite, keep_header=keep_header)
    done = manage(
        env, *argv, check=False, input='{"id": "e1", "type": "t", "source": "s"}\n'
    )
    _one_clear_line(done, db)


@pytest.mark.parametrize("reload", [False, True])
def test_runserver_on_a_damaged_file_stops_with_one_line(
    tmp_path: Path, migrated_sqlite: Callable[[Path], Path], reload: bool
) -> None:
    env, db = _damaged(tmp_path, migrated_sqlite, keep_header=True)
    argv = ["runserver", f"127.0.0.1:{free_port()}"]
    if not reload:
        argv.append("--noreload")
    done = manage(env, *argv, check=False, timeout=90)  # main: keeps running, no exit
    _one_clear_line(done, db)


def test_a_healthy_file_is_untouched(
    tmp_path: Path, migrated_sqlite: Callable[[Path], Path]
) -> None:
    data_dir = tmp_path / "data"
    env = _env(data_dir)
    migrated_sqlite(data_dir / "loopsweb.sqlite3")
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "routes", "list")
    assert os.path.getsize(data_dir / "loopsweb.sqlite3") > 0
