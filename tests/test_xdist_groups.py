"""`make test` runs each suite with `--dist loadgroup`: the tests of one `xdist_group` on one
worker. pytest 9.2 with pytest-xdist 3.8 ignored every group with no warning (the worker's
group suffix never reached the node id), so this runs pytest with this environment's plugins,
as scripts/test.sh does, on a file of grouped and ungrouped tests and reads where each ran.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Starts pytest, without Django (no database at all): the PostgreSQL suite would run the very
# same thing.
pytestmark = [pytest.mark.slow, pytest.mark.own_database]

GROUPED = """
import os
import pytest

def _where(name):
    with open(os.path.join(os.environ["WHERE_DIR"], name), "w") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    _where(f"grouped-{n}")

@pytest.mark.parametrize("n", range(6))
def test_free(n):
    _where(f"free-{n}")
"""


def test_the_tests_of_one_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    where = tmp_path / "where"
    where.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "3",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:django",
            str(tmp_path / "test_grouped.py"),
        ],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "WHERE_DIR": str(where)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = {p.name: p.read_text() for p in where.iterdir()}
    assert len(ran) == 12, ran
    grouped = {w for name, w in ran.items() if name.startswith("grouped-")}
    assert len(grouped) == 1, f"one group ran on several workers: {ran}"
    # and the others are spread, so the check above is not one worker doing everything
    assert len(set(ran.values())) > 1, ran
