"""The product, its templates and its documents cite by path, never by tracker issue
number: "(issue 42)" means nothing to a reader of a clone, a path (`docs/windows.md`,
`ledger/claims.py`) opens; and every repository path they cite exists (a test file, a
module). Migrations are frozen history and left out; the tests may name the issue a test
was written for. No database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.sqlite  # reads files only: one suite runs it

ROOT = Path(__file__).resolve().parents[1]
CHECKED = (
    "domain",
    "agents",
    "ledger",
    "runs",
    "routing",
    "loopsweb",
    "templates",
    "docs",
)
SUFFIXES = {".py", ".md", ".html", ".txt"}
_PATH = re.compile(
    r"(?<![\w./-])((?:domain|agents|ledger|runs|routing|loopsweb|tests|docs|scripts|deploy)"
    r"/[\w./-]*\w\.(?:py|md|sh|html|toml))\b"
)
_TRACKER = re.compile(r"\b[Ii]ssues? #?\d+\b")


def tracker_citations(text: str, origin: str) -> list[str]:
    """`origin:line: text` of each line of `text` that cites a tracker issue by number."""
    return [
        f"{origin}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if _TRACKER.search(line)
    ]


def checked_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for name in CHECKED:
        files += [
            p
            for p in sorted((ROOT / name).rglob("*"))
            if p.is_file()
            and p.suffix in SUFFIXES
            and "migrations" not in p.relative_to(ROOT).parts
            and "__pycache__" not in p.parts
        ]
    return files


def test_nothing_cites_a_tracker_issue_by_number() -> None:
    found = [
        hit
        for path in checked_files()
        for hit in tracker_citations(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
        )
    ]
    assert found == [], "\n".join(found)


def missing_paths(text: str, origin: str) -> list[str]:
    """`origin:line: path` of each repository path cited in `text` that does not exist."""
    return [
        f"{origin}:{number}: {path}"
        for number, line in enumerate(text.splitlines(), 1)
        for path in _PATH.findall(line)
        if not (ROOT / path).exists()
    ]


def test_every_repository_path_cited_exists() -> None:
    found = [
        hit
        for path in checked_files()
        for hit in missing_paths(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
        )
    ]
    assert found == [], "\n".join(found)


def test_the_path_check_catches_a_path_that_is_gone() -> None:
    text = (
        "(tests/ledger/test_git_boundary.py fails on any other call)\n"
        "the one way loopsweb runs git (runs/git.py, docs/isolation.md)\n"
    )
    assert missing_paths(text, "x.py") == ["x.py:1: tests/ledger/test_git_boundary.py"]


@pytest.mark.parametrize(
    ("text", "cited"),
    [
        ('"""One read of an item\'s page (issue 42)."""', True),
        ("# issue 40: the run's work", True),
        ("see Issues 3 and 4", True),
        ("fixed in issue #1234", True),
        ('docs/windows.md, "What a task may claim"', False),
        ("a colour like #fff or &#39; or path/#12", False),
        ("an issue with the account", False),
    ],
)
def test_the_check_catches_an_issue_number(text: str, cited: bool) -> None:
    assert bool(tracker_citations(text, "x.py")) is cited
