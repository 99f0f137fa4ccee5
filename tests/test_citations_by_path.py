"""The product, its templates and its documents cite by path, never by number: not a tracker
issue by its number, "(issue 42)" means nothing to a reader of a clone, a path
(`docs/windows.md`, `ledger/claims.py`) opens; and not an item of a numbered list (a rule, a
convention, a docstring's contract) by its number, "(ledger.claims rule 1)" or "(module
docstring, 3)", because numbers shift when a list is edited: a citation names the file by its
path and the item by its name or a phrase of it (`ledger/claims.py, "the bound"`,
`docs/design.md, "one admission lock"`). A section number after a path (`docs/upstream.md
§3.2.10`) is a heading, not a list item, and stays. Every repository path they cite exists (a
test file, a module). Migrations are frozen history and left out; the tests may name the issue
a test was written for. No database."""

from __future__ import annotations

import re
from collections.abc import Callable
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
# Between a word and the number it cites: spaces, or one line break (with a comment's `#`).
_GAP = r"(?:[ \t]+|[ \t]*\n[ \t]*(?:#[ \t]*)?)"
# An item of a numbered list cited by its number: `rule 3`, `rules 3 and 4`, `contract 5`,
# `convention 2`, `module docstring, 3`, `its docstring's point 3`, `steps 1-3 of the module
# docstring`, `docs/upstream.md §3.6 step 4`, a dotted module and a bare number
# (`domain.templates 4`), and a module or a `name` and a number in parentheses
# (`(stepguard, 5)`, `(runs.delivery, 1)`, `(`step_start`, 3)`; not a call's arguments,
# `round(x, 3)`, a tuple, `(run.id, 2)`, nor a migration's `0022`).
_NUMBERED_ITEM = re.compile(
    rf"\b(?:rules?|conventions?|contracts?){_GAP}\d"
    rf"|\bdocstring(?:'s)?,?{_GAP}(?:(?:point|item|step){_GAP})?\d"
    rf"|\b(?:steps?|items?|points?){_GAP}\d+(?:-\d+)?{_GAP}of{_GAP}(?:the{_GAP}|its{_GAP})?"
    rf"(?:module{_GAP})?docstring"
    rf"|§\d+(?:\.\d+)*,?{_GAP}(?:steps?|items?|points?){_GAP}\d"
    rf"|\b(?:domain|agents|ledger|runs|routing|loopsweb)(?:\.\w+)+,?{_GAP}\d+[a-z]?\b(?!\.\d)"
    rf"|(?<![\w\])])\((?P<name>`[\w.]+`|[A-Za-z_][\w.]*),"
    rf"{_GAP}\d{{1,2}}[a-z]?(?:-\d{{1,2}})?\)",
    re.IGNORECASE,
)
# A heading that names a numbered rule or convention where it is written (docs/design.md,
# docs/style.md): the list itself, not a citation of it.
_DEFINITION = re.compile(r"^#{1,6}\s+(?:Rule|Convention)\s+\d+:")


def tracker_citations(text: str, origin: str) -> list[str]:
    """`origin:line: text` of each line of `text` that cites a tracker issue by number."""
    return [
        f"{origin}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if _TRACKER.search(line)
    ]


def _names_a_module(name: str) -> bool:
    """Whether `name`, before a number in parentheses, is what a citation names: a `name` in
    backticks, or a product module (`runs.delivery`, `stepguard`), not a tuple's variable."""
    if name.startswith("`"):
        return True
    path = name.replace(".", "/") + ".py"
    return (ROOT / path).is_file() or any((ROOT / d / path).is_file() for d in CHECKED)


def item_citations(text: str, origin: str) -> list[str]:
    """`origin:line: text` of each line of `text` where a citation of a numbered list's item
    by its number begins."""
    lines = text.splitlines()
    found: list[str] = []
    for match in _NUMBERED_ITEM.finditer(text):
        number = text.count("\n", 0, match.start()) + 1
        line = lines[number - 1]
        name = match["name"]
        if _DEFINITION.match(line) or (name is not None and not _names_a_module(name)):
            continue
        hit = f"{origin}:{number}: {line.strip()}"
        if hit not in found:  # a line with two such citations is listed once
            found.append(hit)
    return found


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


def _hits(check: Callable[[str, str], list[str]]) -> list[str]:
    """What `check(text, origin)` finds in every checked file."""
    return [
        hit
        for path in checked_files()
        for hit in check(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]


def test_nothing_cites_a_tracker_issue_by_number() -> None:
    found = _hits(tracker_citations)
    assert found == [], "\n".join(found)


def test_nothing_cites_a_docstring_item_by_number() -> None:
    found = _hits(item_citations)
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
    found = _hits(missing_paths)
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


@pytest.mark.parametrize(
    ("text", "cited"),
    [
        ("the task waits (ledger.claims rule 1)", True),
        ("a whole-pool wait (failover rule 5)", True),
        ('"""Rule 5."""', True),
        ("(rules 3 and 4)", True),
        ("(docs/design.md rule 2)", True),
        ("# the pool routes (domain.templates 4), as", True),
        ("(runs.runner, module docstring 3b)", True),
        ("what it must not print (module docstring, 2)", True),
        ("Pruning (runs.worktrees, its docstring's point 3)", True),
        ('"""Steps 1-3 of the module docstring."""', True),
        ("(docs/upstream.md §3.6 step 4)", True),
        ("(stepguard, 5)", True),
        ("(`step_start`, 3)", True),
        ("# (ledger.services.failover rule\n# 7)", True),
        ("(agents.agent_output contract 5)", True),
        ("docs/style.md convention 2", True),
        ('(ledger/claims.py, "the bound")', False),
        ('(docs/design.md, "one admission lock")', False),
        ("(worker ≠ verifier, module docstring)", False),
        ("docs/upstream.md §3.2.10", False),
        ("### Rule 2: one admission lock", False),
        ("three rules hold; 2 rules differ", False),
        ("round(remaining, 3) and split('/', 1)", False),
        ("(`reason_code`, 0022)", False),
        ("== [(run.id, 2)] and (None, 0)", False),
        ("(0.4.12, described in docs/upstream.md)", False),
        ("the steps 24 h and 7 d", False),
    ],
)
def test_the_check_catches_an_item_cited_by_number(text: str, cited: bool) -> None:
    assert bool(item_citations(text, "x.py")) is cited
