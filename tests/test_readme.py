"""The README is an operator's guide read in ten minutes (issue 42 item 7): at most
MAX_LINES lines; every number in its prose is a setting, an option, a command or a link
(inside backticks, a code block or a link), never a measurement; `make run` and `make test`
are its two set-up commands and both are Makefile targets; and every link between the
README and the docs pages reaches a file and, with `#anchor`, a heading there. No database.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 450
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
URL = re.compile(r"https?://\S+")


def prose(text: str) -> str:
    """The text a reader reads as sentences: no code blocks, code spans, link targets or
    numbered-list markers (line numbers kept)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    text = re.sub(r"^(\s*)\d+\. ", r"\1", text, flags=re.M)
    text = CODE_SPAN.sub("", text)
    text = LINK.sub(lambda m: m.group(1), text)
    return URL.sub("", text)


def numbers_in_prose(text: str) -> list[str]:
    found = []
    for number, line in enumerate(prose(text).splitlines(), 1):
        if re.search(r"\d", line):
            found.append(f"{number}: {line.strip()}")
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_at_most_max_lines_long() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_LINES


def test_every_number_in_the_readme_prose_is_code_or_a_link() -> None:
    assert numbers_in_prose(README.read_text(encoding="utf-8")) == []


def test_make_run_and_make_test_are_the_two_set_up_commands() -> None:
    text = README.read_text(encoding="utf-8")
    set_up = text.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    block = FENCE.search(set_up)
    assert block is not None
    commands = [
        line.split("#")[0].strip() for line in block.group(0).splitlines()[1:-1]
    ]
    assert commands == ["make run", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_links_between_the_readme_and_the_docs_reach_a_file_and_a_heading() -> None:
    problems = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for match in LINK.finditer(text):
            target = match.group(2)
            if re.match(r"[a-z]+:", target):
                continue  # https://, mailto:
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                problems.append(f"{page.name}: {target}: no such file")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                problems.append(f"{page.name}: {target}: no such heading")
    assert problems == []


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("Runs finish in about 40 s.\n", ["1: Runs finish in about 40 s."]),
        ("Set `LOOPSWEB_RUN_WORKERS=8` and `--max-active 2`.\n", []),
        (
            "```\nmake run  # 8 workers\n```\nSee [section 9](elsewhere.html).\n",
            ["4: See section 9."],
        ),
        ("See [the results](tests/bench/RESULTS.md#9-hosts).\n", []),
    ],
)
def test_the_number_check(text: str, found: list[str]) -> None:
    assert numbers_in_prose(text) == found


def test_the_anchor_of_a_heading() -> None:
    assert slug("Time limits, live output and the work a run leaves") == (
        "time-limits-live-output-and-the-work-a-run-leaves"
    )
    assert slug("What `/ops/` says about capacity") == "what-ops-says-about-capacity"
    assert slug("HTTP API and metrics") == "http-api-and-metrics"
