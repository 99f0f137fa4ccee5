"""The code map (docs/development.md, "Code map") against the tree, both ways:

- every path the map names exists: a package directory on a top-level line, and on each
  indented line a module (`name.py`) or a subpackage (`name/`), relative to its package;
- each of the six packages has a top-level line;
- every product module (`*.py` under domain, agents, ledger, runs, routing and loopsweb;
  `migrations/` and `__init__.py` aside) is named: by a line of its own, or by its
  directory's line naming it by its bare name (`cascade` on the `services/` line);
- a subpackage's line names every module directly in it, each by its bare name, even one
  that also has a line of its own;
- the block keeps its shape: a top-level line names a directory, an indented line (two
  spaces) a module or a subpackage, a line indented deeper goes on with the description
  above it, every line has a description and none is over 100 columns.

Each check is a function over the map's text (and, for the tree, the paths it holds), and
each has a test that feeds it a violation. No database, no process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "development.md"
HEADING = "## Code map"
PACKAGES = ("domain", "agents", "ledger", "runs", "routing", "loopsweb")
INDENT = 2  # an entry's indent; a deeper one goes on with the description above it
WIDTH = 100


@dataclass(frozen=True)
class Entry:
    line: int  # in the block, from 1
    path: str  # from the repository's root: `ledger/`, `ledger/services/`, `ledger/ids.py`
    description: str
    top: bool  # a package's line (no indent)


def map_block(guide: str) -> str:
    """The fenced block of the guide's "Code map" section (without its fences)."""
    _, found, section = guide.partition(f"\n{HEADING}\n")
    if not found:
        raise ValueError(f"no {HEADING!r} section")
    section = section.split("\n## ", 1)[0]
    parts = section.split("```")
    if len(parts) < 3:
        raise ValueError(f"no fenced block in the {HEADING!r} section")
    return parts[1].partition("\n")[2]  # the fence's own line (its info string) dropped


def indent_of(text: str) -> int:
    return len(text) - len(text.lstrip(" "))


def entries(block: str) -> list[Entry]:
    """The block's lines as entries: a top-level line is a directory of the repository's
    root, an indented one a path inside the last top-level line's, and a deeper line goes on
    with the description above it. Lines of another shape are shape_problems' to report."""
    found: list[Entry] = []
    top = ""
    for number, text in enumerate(block.splitlines(), 1):
        if not text.strip():
            continue
        indent = indent_of(text)
        head, _, description = text.strip().partition(" ")
        if indent == 0:
            top = head
            found.append(Entry(number, head, description.strip(), True))
        elif indent == INDENT and top:
            found.append(Entry(number, top + head, description.strip(), False))
        elif indent > INDENT and found:
            last = found[-1]
            joined = f"{last.description} {text.strip()}".strip()
            found[-1] = Entry(last.line, last.path, joined, last.top)
    return found


def shape_problems(block: str) -> list[str]:
    """Lines the map's readers (and `entries`) cannot take as the block's format says."""
    problems: list[str] = []
    lines = block.splitlines()
    seen_top = seen_entry = False
    for number, text in enumerate(lines, 1):
        where = f"code map line {number}"
        if len(text) > WIDTH:
            problems.append(f"{where}: {len(text)} columns, over {WIDTH}")
        if not text.strip():
            continue
        indent = indent_of(text)
        if indent > INDENT:
            if not seen_entry:
                problems.append(f"{where}: a description before any entry")
            continue
        seen_entry = True
        head, _, description = text.strip().partition(" ")
        if indent == 0:
            seen_top = True
            if not head.endswith("/"):
                problems.append(f"{where}: {head} is not a directory (`name/`)")
        elif indent == INDENT:
            if not seen_top:
                problems.append(f"{where}: {head} comes before any package's line")
            if not head.endswith((".py", "/")):
                problems.append(
                    f"{where}: {head} is neither a module (`name.py`) nor a subpackage "
                    "(`name/`)"
                )
        else:
            problems.append(f"{where}: indented {indent}, neither 0 nor {INDENT}")
        # the description may begin on the next line, indented deeper
        following = lines[number] if number < len(lines) else ""
        goes_on = bool(following.strip()) and indent_of(following) > INDENT
        if not description.strip() and not goes_on:
            problems.append(f"{where}: {head} has no description")
    return problems


def named(name: str, description: str) -> bool:
    """`name` appears in `description` as a bare name: a word of its own, not part of a
    longer one (`work_items` does not name `work`) nor of a dotted or slashed path
    (`ledger.runs`, `/ops/runs/` do not name `runs`)."""
    pattern = rf"(?<![\w./-]){re.escape(name)}(?![\w/-])"
    return re.search(pattern, description) is not None


def missing_paths(found: Iterable[Entry], exists: Callable[[str], bool]) -> list[str]:
    """`code map line N: PATH does not exist` for each path the map names that `exists`
    refuses (a path ending in `/` is a directory, any other a file)."""
    return [
        f"code map line {entry.line}: {entry.path} does not exist"
        for entry in found
        if not exists(entry.path)
    ]


def split(module: str) -> tuple[str, str]:
    """`ledger/services/runs.py` -> (`ledger/services/`, `runs`)."""
    folder, _, filename = module.rpartition("/")
    return f"{folder}/", filename.removesuffix(".py")


def unnamed_modules(found: Iterable[Entry], modules: Iterable[str]) -> list[str]:
    """Modules (paths from the root) that neither have a line of their own nor are named,
    by their bare name, on their directory's line."""
    found = list(found)
    files = {entry.path for entry in found if not entry.path.endswith("/")}
    folders: dict[str, list[str]] = {}
    for entry in found:
        if entry.path.endswith("/"):
            folders.setdefault(entry.path, []).append(entry.description)
    missing = []
    for module in modules:
        if module in files:
            continue
        folder, name = split(module)
        if any(named(name, text) for text in folders.get(folder, [])):
            continue
        missing.append(f"{module} is not in the code map")
    return missing


def incomplete_subpackages(found: Iterable[Entry], modules: Iterable[str]) -> list[str]:
    """`code map line N: DIR/ does not name NAME` for each module directly in a subpackage
    (an indented `name/` line) that the line does not name."""
    modules = list(modules)
    problems = []
    for entry in found:
        if entry.top or not entry.path.endswith("/"):
            continue
        for module in modules:
            folder, name = split(module)
            if folder == entry.path and not named(name, entry.description):
                problems.append(
                    f"code map line {entry.line}: {entry.path} does not name {name}"
                )
    return problems


# --- the tree -----------------------------------------------------------------------------------


def product_modules() -> list[str]:
    """Every product module, as a path from the root: migrations and `__init__.py` aside."""
    return sorted(
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.relative_to(ROOT).parts
        and path.name != "__init__.py"
    )


def in_the_tree(path: str) -> bool:
    target = ROOT / path
    return target.is_dir() if path.endswith("/") else target.is_file()


def the_map() -> str:
    return map_block(GUIDE.read_text(encoding="utf-8"))


def test_the_code_map_keeps_its_shape() -> None:
    problems = shape_problems(the_map())
    assert problems == [], "\n".join(problems)


def test_every_path_the_code_map_names_exists() -> None:
    problems = missing_paths(entries(the_map()), in_the_tree)
    assert problems == [], "\n".join(problems)


def test_every_product_module_is_in_the_code_map() -> None:
    modules = product_modules()
    assert "ledger/services/cascade.py" in modules and "runs/runner.py" in modules
    assert not [m for m in modules if "/migrations/" in m or m.endswith("__init__.py")]
    problems = unnamed_modules(entries(the_map()), modules)
    assert problems == [], "\n".join(problems)


def test_every_subpackage_line_names_each_of_its_modules() -> None:
    found = entries(the_map())
    assert {"ledger/services/", "routing/admission/", "loopsweb/settings/"} <= {
        entry.path for entry in found
    }
    problems = incomplete_subpackages(found, product_modules())
    assert problems == [], "\n".join(problems)


def test_every_package_has_a_top_level_line() -> None:
    tops = {entry.path for entry in entries(the_map()) if entry.top}
    assert {f"{package}/" for package in PACKAGES} <= tops


# --- each check catches what it is for ----------------------------------------------------------

MAP = """\
ledger/        the record
  ids.py       ids that sort
  services/    lifecycle writes: runs,
               cascade
runs/          execution
  runner.py    the runner
"""
TREE = {
    "ledger/",
    "ledger/ids.py",
    "ledger/services/",
    "ledger/services/runs.py",
    "ledger/services/cascade.py",
    "runs/",
    "runs/runner.py",
}
MODULES = [
    "ledger/ids.py",
    "ledger/services/cascade.py",
    "ledger/services/runs.py",
    "runs/runner.py",
]


def test_the_block_is_found_under_its_heading() -> None:
    guide = f"# Guide\n\n{HEADING}\n\nProse.\n\n```\n{MAP}```\n\nMore.\n\n## Tests\n"
    assert map_block(guide) == MAP
    with pytest.raises(ValueError, match="no '## Code map' section"):
        map_block("# Guide\n\n## Tests\n")
    with pytest.raises(ValueError, match="no fenced block"):
        map_block(
            f"# Guide\n\n{HEADING}\n\nProse only.\n\n## Tests\n\n```\nx/ y\n```\n"
        )


def test_entries_are_paths_from_the_root_with_their_whole_description() -> None:
    assert entries(MAP) == [
        Entry(1, "ledger/", "the record", True),
        Entry(2, "ledger/ids.py", "ids that sort", False),
        Entry(3, "ledger/services/", "lifecycle writes: runs, cascade", False),
        Entry(5, "runs/", "execution", True),
        Entry(6, "runs/runner.py", "the runner", False),
    ]


def test_a_good_map_passes_every_check() -> None:
    found = entries(MAP)
    assert shape_problems(MAP) == []
    assert missing_paths(found, TREE.__contains__) == []
    assert unnamed_modules(found, MODULES) == []
    assert incomplete_subpackages(found, MODULES) == []


def test_the_check_catches_a_path_that_does_not_exist() -> None:
    stale = MAP + "  gone.py      removed last week\n  old/         a folder no more\n"
    assert missing_paths(entries(stale), TREE.__contains__) == [
        "code map line 7: runs/gone.py does not exist",
        "code map line 8: runs/old/ does not exist",
    ]
    # a directory named as a file, a package that is not there
    wrong = MAP.replace("  ids.py ", "  ids/   ").replace("runs/ ", "jobs/ ")
    assert missing_paths(entries(wrong), TREE.__contains__) == [
        "code map line 2: ledger/ids/ does not exist",
        "code map line 5: jobs/ does not exist",
        "code map line 6: jobs/runner.py does not exist",
    ]


def test_the_check_catches_a_module_the_map_misses() -> None:
    modules = [
        *MODULES,
        "ledger/reaper.py",  # no line of its own
        "ledger/services/steps.py",  # not named on its directory's line
        "ledger/webkit/cells.py",  # its directory has no line
        "runs/git.py",
    ]
    assert unnamed_modules(entries(MAP), modules) == [
        "ledger/reaper.py is not in the code map",
        "ledger/services/steps.py is not in the code map",
        "ledger/webkit/cells.py is not in the code map",
        "runs/git.py is not in the code map",
    ]


def test_the_check_catches_a_subpackage_line_that_misses_a_module() -> None:
    # cascade has a line of its own, so the map names it; its directory's line must too
    partial = MAP.replace(
        "               cascade\n", "  services/cascade.py  a run's end\n"
    )
    found = entries(partial)
    assert unnamed_modules(found, MODULES) == []
    assert incomplete_subpackages(found, MODULES) == [
        "code map line 3: ledger/services/ does not name cascade"
    ]
    # a top-level line is a package's: its modules have lines of their own
    assert incomplete_subpackages(entries("ledger/  the record\n"), MODULES) == []


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("runs, cascade", True),
        ("lifecycle writes (runs)", True),
        ("`runs`: claim, lease", True),
        ("the runs' admin", True),
        ("work_items", False),  # not `work`
        ("see ledger.runs", False),
        ("/ops/runs/", False),
        ("re-runs", False),
    ],
)
def test_a_bare_name_is_a_word_of_its_own(description: str, expected: bool) -> None:
    name = "work" if description == "work_items" else "runs"
    assert named(name, description) is expected


def test_the_check_catches_a_block_out_of_shape() -> None:
    bad = (
        "  early.py     before any package\n"  # 1
        "ledger/        the record\n"  # 2
        "routing/models.py  a file on a package's line\n"  # 3
        "  README       neither a module nor a subpackage\n"  # 4
        " ids.py        indented one space\n"  # 5
        "  bare.py\n"  # 6: no description
        "  wrapped.py\n"  # 7: its description on the next line
        "               goes on here\n"  # 8
        f"  long.py      {'x' * WIDTH}\n"  # 9
    )
    assert shape_problems(bad) == [
        "code map line 1: early.py comes before any package's line",
        "code map line 3: routing/models.py is not a directory (`name/`)",
        "code map line 4: README is neither a module (`name.py`) nor a subpackage (`name/`)",
        "code map line 5: indented 1, neither 0 nor 2",
        "code map line 6: bare.py has no description",
        f"code map line 9: {15 + WIDTH} columns, over {WIDTH}",
    ]
    assert shape_problems("   goes on with nothing\n") == [
        "code map line 1: a description before any entry"
    ]
