"""The documents the code cites are in the repository (docs/README.md).

A citation is `docs/<page>.md` followed by what it points at: sections (`§3.2.6`, a range
`§3.2.1-2` or `§2-§4`, a list `§2.1, §2.2`), rules (`rule 2`) or conventions
(`convention 2`). Every page a citation names must exist under `docs/`, and so must every
section, rule and convention it names: a heading `## §3.2`, `### Rule 2` or
`### Convention 2` in that page. In product code, tests, templates and the README every `§`
belongs to such a citation, no citation names its page twice (`docs/upstream.md
docs/upstream.md §3`), and nothing cites a document outside the repository. Inside the
docs, a bare `§N` means a section of the same page, and a markdown link `[x](page.md) §N`
cites that page. No database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import source_index

# One worker runs the checks that parse the sources (tests/source_index.py: each file read and
# parsed once per process, not once per worker).
pytestmark = pytest.mark.xdist_group("source_rules")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
THIS_FILE = Path(__file__).resolve()

# Where code, tests and templates live; the README is checked with them.
SCANNED_DIRS = (
    "domain",
    "agents",
    "ledger",
    "runs",
    "routing",
    "loopsweb",
    "templates",
    "tests",
)
SCANNED_SUFFIXES = {".py", ".html", ".txt", ".md"}

# Phrases that cite a document outside the repository (the citations before docs/ existed),
# each with a piece of text every match holds: a text without it is not searched (most of
# the check's time, on four megabytes of code, tests and templates).
FORBIDDEN = (
    (re.compile(r"reference\s*§", re.IGNORECASE), "reference §", "§"),
    (re.compile(r"DESIGN(?:\.md)?\s+rule"), "DESIGN rule", "DESIGN"),
    (re.compile(r"\bDESIGN\.md"), "DESIGN.md", "DESIGN.md"),
    (re.compile(r"\bSTYLE\.md"), "STYLE.md", "STYLE.md"),
    (re.compile(r"\.\./shared"), "../shared", "../shared"),
)

_SECTION = r"§\d+(?:\.\d+)*(?:-\d+)?"
_NUMBERED = r"(?:rules?|conventions?)\s+\d+(?:(?:,\s*|\s+and\s+|\s+or\s+)\d+)*"
_REF = rf"(?:{_SECTION}|{_NUMBERED})"
_SEP = r"(?:,\s*|\s+and\s+|\s+or\s+|\s*[-–]\s*)"
CITATION = re.compile(
    rf"(?:(?<![\w/])docs/|\]\()(?P<page>[A-Za-z0-9_-]+\.md)\)?"
    rf"(?P<refs>\s+{_REF}(?:{_SEP}{_REF})*)?"
)
REF = re.compile(rf"{_SECTION}|{_NUMBERED}")
HEADING = re.compile(
    r"^#{1,6}\s+(?:§(?P<section>\d+(?:\.\d+)*)|(?P<kind>Rule|Convention)\s+(?P<number>\d+))\b",
    re.MULTILINE,
)
BARE_SECTION = re.compile(r"§\d")
# Between two mentions of one page, nothing but spaces, line breaks, comment markers or a
# slash: one citation that names its page twice (`docs/upstream.md / docs/upstream.md §3`).
DOUBLING_GAP = re.compile(r"[\s#/*>\"'(]*")


@dataclass(frozen=True)
class Target:
    kind: str  # "§", "rule" or "convention"
    name: str  # "3.2.6", "2"


def anchors(page_text: str) -> set[Target]:
    found = set()
    for match in HEADING.finditer(page_text):
        if match["section"]:
            found.add(Target("§", match["section"]))
        else:
            found.add(Target(match["kind"].lower(), match["number"]))
    return found


def targets(ref: str) -> list[Target]:
    """What one reference names: `§3.2.1-2` is §3.2.1 and §3.2.2, `rules 1 and 4` two rules."""
    if ref.startswith("§"):
        number, _, last = ref[1:].partition("-")
        names = [number]
        if last:
            names.append(".".join(number.split(".")[:-1] + [last]))
        return [Target("§", name) for name in names]
    word, _, numbers = ref.partition(" ")
    kind = "rule" if word.startswith("rule") else "convention"
    return [Target(kind, n) for n in re.findall(r"\d+", numbers)]


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def citation_problems(
    text: str,
    *,
    origin: str,
    pages: dict[str, str],
    own_page: str | None = None,
) -> list[str]:
    """Everything wrong with the citations in `text` (from file `origin`).

    `pages` maps a page name (`upstream.md`) to its text. `own_page` is set for a docs page:
    its bare `§N` cite itself; elsewhere a `§` outside a citation is a problem.
    """
    problems: list[str] = []
    covered: list[tuple[int, int]] = []
    anchored: dict[str, set[Target]] = {}  # page -> anchors(its text), read once

    def check(page: str, wanted: list[Target], offset: int) -> None:
        where = f"{origin}:{line_of(text, offset)}"
        if page not in pages:
            problems.append(f"{where}: cites docs/{page}, which does not exist")
            return
        have = anchored.get(page)
        if have is None:
            have = anchored[page] = anchors(pages[page])
        for target in wanted:
            if target not in have:
                label = (
                    f"§{target.name}"
                    if target.kind == "§"
                    else f"{target.kind} {target.name}"
                )
                problems.append(f"{where}: docs/{page} has no {label}")

    previous: re.Match[str] | None = None
    # every citation begins with `docs/` or `](`: a text with neither has none
    cites = "docs/" in text or "](" in text
    for match in CITATION.finditer(text) if cites else ():
        refs = match["refs"] or ""
        wanted = [t for ref in REF.findall(refs) for t in targets(ref)]
        check(match["page"], wanted, match.start())
        covered.append(match.span())
        if (
            previous is not None
            and previous["page"] == match["page"]
            and not previous["refs"]
            and DOUBLING_GAP.fullmatch(text, previous.end(), match.start())
        ):
            problems.append(
                f"{origin}:{line_of(text, previous.start())}: names docs/{match['page']} "
                "twice in one citation"
            )
        previous = match

    for match in BARE_SECTION.finditer(text):
        if any(start <= match.start() < end for start, end in covered):
            continue
        if own_page is not None:
            ref = REF.match(text, match.start())
            assert ref is not None
            check(own_page, targets(ref.group()), match.start())
        else:
            problems.append(
                f"{origin}:{line_of(text, match.start())}: "
                f"{text[match.start() : match.start() + 12]!r} names no document "
                "(write docs/upstream.md §N)"
            )

    if own_page is None:
        for pattern, label, needle in FORBIDDEN:
            for match in pattern.finditer(text) if needle in text else ():
                problems.append(
                    f"{origin}:{line_of(text, match.start())}: cites {label!r}, "
                    "a document outside the repository"
                )
    return problems


def doc_pages() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md"))}


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for name in SCANNED_DIRS:
        files += [
            p
            for p in sorted((ROOT / name).rglob("*"))
            if p.is_file()
            and p.suffix in SCANNED_SUFFIXES
            and p.resolve() != THIS_FILE
            and "__pycache__" not in p.parts
        ]
    return files


def test_the_docs_the_code_cites_exist() -> None:
    assert {"README.md", "design.md", "upstream.md", "style.md"} <= set(doc_pages())


def test_every_citation_in_code_tests_templates_and_readme_resolves() -> None:
    pages = doc_pages()
    problems: list[str] = []
    for path in scanned_files():
        text = source_index.text(path)
        problems += citation_problems(
            text, origin=str(path.relative_to(ROOT)), pages=pages
        )
    assert problems == [], "\n".join(problems)


def test_every_citation_inside_the_docs_resolves() -> None:
    pages = doc_pages()
    problems: list[str] = []
    for name, text in pages.items():
        problems += citation_problems(
            text, origin=f"docs/{name}", pages=pages, own_page=name
        )
    assert problems == [], "\n".join(problems)


def test_the_docs_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    missing = [
        name for name in doc_pages() if name != "README.md" and f"({name})" not in index
    ]
    assert missing == []


def test_design_keeps_the_seven_rules_and_upstream_its_section_numbers() -> None:
    # Citations were renumbered by name only: "rule N" and "§N" kept their numbers.
    pages = doc_pages()
    assert {Target("rule", str(n)) for n in range(1, 8)} <= anchors(pages["design.md"])
    upstream = anchors(pages["upstream.md"])
    for section in ("1", "2", "3", "4", "5", "6", "8", "3.2.12", "4.6", "5.2.3"):
        assert Target("§", section) in upstream
    assert Target("§", "7") not in upstream  # upstream's numbering skips 7


PAGES = {
    "upstream.md": "# Upstream\n## §3 Admission\n### §3.2 Pre\n#### §3.2.1 Id\n#### §3.2.2 E\n",
    "design.md": "# Design\n### Rule 1: counts\n### Rule 2: lock\n",
}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("see docs/upstream.md §3.2.1-2 and docs/design.md rule 2", None),
        ("(docs/upstream.md §3, §3.2.2)", None),
        ("docs/upstream.md §3-§3.2", None),
        ("see docs/design.md rules 1 and 2", None),
        ("see docs/upstream.md §3.9", "docs/upstream.md has no §3.9"),
        ("docs/upstream.md §3.2.1-3", "docs/upstream.md has no §3.2.3"),
        ("(docs/upstream.md §3, §4)", "docs/upstream.md has no §4"),
        ("docs/design.md rule 7", "docs/design.md has no rule 7"),
        ("docs/design.md convention 1", "docs/design.md has no convention 1"),
        ("docs/nowhere.md §3", "cites docs/nowhere.md, which does not exist"),
        ("as upstream does (§3.2)", "names no document"),
        ("upstream (reference §3.2)", "cites 'reference §'"),
        ("the lock (DESIGN rule 2)", "cites 'DESIGN rule'"),
        ("pure (STYLE.md convention 2)", "cites 'STYLE.md'"),
        ("see ../shared/DESIGN.md", "cites '../shared'"),
        ("docs/upstream.md / docs/upstream.md §3.2.1", "names docs/upstream.md twice"),
        ("(docs/upstream.md\n# docs/upstream.md §3)", "names docs/upstream.md twice"),
        ("(docs/design.md docs/design.md rule 1)", "names docs/design.md twice"),
        ("docs/upstream.md §3.2.1 -> docs/upstream.md §3.2.2", None),
        ("docs/upstream.md §3 and docs/design.md rule 1", None),
        ("[upstream](upstream.md) and docs/upstream.md §3", None),
    ],
)
def test_the_check_catches_a_bad_citation(text: str, problem: str | None) -> None:
    found = citation_problems(f"x = 1\n# {text}\n", origin="f.py", pages=PAGES)
    if problem is None:
        assert found == []
    else:
        assert found and any(problem in p and p.startswith("f.py:2:") for p in found), (
            found
        )


def test_inside_a_page_a_bare_section_cites_the_page_itself() -> None:
    page = PAGES["upstream.md"] + "See §3.2.2 and [design](design.md) rule 1.\n"
    assert (
        citation_problems(page, origin="u", pages=PAGES, own_page="upstream.md") == []
    )
    bad = page + "And §5.\n"
    assert citation_problems(bad, origin="u", pages=PAGES, own_page="upstream.md") == [
        "u:7: docs/upstream.md has no §5"
    ]
