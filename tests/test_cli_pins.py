"""The agent CLIs' versions the documents name are the ones the suite installs and tests
(`tests/agents/clis.py`, CLI_PACKAGES): every `npm install` of one in the README or docs/
pins that version, and every version written after a package's name is that version. No
database, no process."""

from __future__ import annotations

import re
from pathlib import Path

from tests.agents.clis import CLI_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VERSION = r"(\d+\.\d+\.\d+)"


def pin_problems(text: str, where: str) -> list[str]:
    """Each place in `text` that installs a pinned CLI unpinned or names another version."""
    problems = []
    for package, version, _ in CLI_PACKAGES.values():
        name = re.escape(package)
        for line in text.splitlines():
            if re.search(r"\bnpm (?:install|i)\b", line) and re.search(
                rf"(?<![\w@/-]){name}(?![\w-])(?!@{re.escape(version)}\b)", line
            ):
                problems.append(f"{where}: {package} installed without @{version}")
        for found in re.finditer(rf"{name}(?:@|`? ){VERSION}", text):
            if found.group(1) != version:
                problems.append(f"{where}: {package} {found.group(1)}, not {version}")
    return problems


def test_the_documents_pin_the_versions_the_suite_tests() -> None:
    problems = [
        problem
        for page in PAGES
        for problem in pin_problems(page.read_text(encoding="utf-8"), page.name)
    ]
    assert problems == []
    # The README's real-agent quickstart installs each CLI at its pin.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for package, version, _ in CLI_PACKAGES.values():
        assert f"npm install -g {package}@{version}" in readme


def test_an_unpinned_or_other_version_is_a_problem() -> None:
    codex, version, _ = CLI_PACKAGES["codex"]
    assert pin_problems(f"npm install -g {codex}\n", "x") == [
        f"x: {codex} installed without @{version}"
    ]
    assert pin_problems(f"npm i {codex}@0.1.0\n", "x") == [
        f"x: {codex} installed without @{version}",
        f"x: {codex} 0.1.0, not {version}",
    ]
    assert pin_problems(f"`{codex}` 9.9.9 was measured", "x") == [
        f"x: {codex} 9.9.9, not {version}"
    ]
    assert pin_problems(f"npm install -g {codex}@{version}\n", "x") == []
