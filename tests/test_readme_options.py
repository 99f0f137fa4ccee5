"""The option tables (docs/options.md, issue 29 item 14; moved from the README in issue 42) and
the help texts agree with the code: each command's argparse options are exactly the options
its tables list, and the numeric bounds table is `domain/bounds.py`'s option rows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.management import call_command, load_command_class

from domain.bounds import BOUNDS, Bound

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
OPTIONS = ROOT / "docs" / "options.md"
COMMANDS = ("route_event", "drain", "schedule_drain", "ingest_events")
# Options every Django command has; the tables do not repeat them.
DJANGO_OPTIONS = {
    "--help",
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


def section(title: str) -> str:
    text = OPTIONS.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def readme_tables() -> dict[str, set[str]]:
    """Command -> options, from the tables under `## Command options`: each table names
    its commands in the backticks of the line that introduces it."""
    section_text = section("Command options")
    options: dict[str, set[str]] = {}
    commands: list[str] = []
    for line in section_text.splitlines():
        if line.startswith("|"):
            first = line.split("|")[1]
            for option in re.findall(r"`(--[a-z-]+)`", first):
                for command in commands:
                    options.setdefault(command, set()).add(option)
        elif line.strip():
            commands = [
                word.split()[0]
                for word in re.findall(r"`([a-z_]+(?: [A-Z ]+)?)`", line)
                if word.split()[0] in COMMANDS
            ]
    return options


def parser_options(command: str) -> set[str]:
    parser = load_command_class("routing", command).create_parser("manage.py", command)
    found = set()
    for action in parser._actions:
        found.update(s for s in action.option_strings if s.startswith("--"))
    return found - DJANGO_OPTIONS


@pytest.mark.parametrize("command", COMMANDS)
def test_the_tables_list_every_option_of_the_command_and_no_other(
    command: str,
) -> None:
    assert readme_tables().get(command, set()) == parser_options(command)


@pytest.mark.parametrize("command", COMMANDS)
def test_no_help_text_says_pool_routing_needs_codewith(command: str) -> None:
    parser = load_command_class("routing", command).create_parser("manage.py", command)
    helps = " ".join(a.help or "" for a in parser._actions)
    assert "needs codewith" not in helps


def test_drain_help_and_readme_say_one_item_unless_max_dispatch(capsys) -> None:
    with pytest.raises(SystemExit):
        call_command("drain", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "admits one item unless --max-dispatch says more" in help_text
    assert "(default 1: a drain admits one item unless you raise it)" in help_text
    assert "A drain admits one item unless `--max-dispatch` says more" in (
        README.read_text()
    )


def documented_bounds() -> dict[str, Bound]:
    """Bounds-table key -> the range its row gives (`routes list --limit` is the row
    `routes --limit`, `schedule_drain --every` is `--every`)."""
    found: dict[str, Bound] = {}
    for line in section("Numeric bounds").splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        low, high = (int(n.replace(",", "")) for n in cells[1].split(" – "))
        for name in re.findall(r"`([a-z_ ]*--[a-z-]+)`", cells[0]):
            words = name.split()
            key = f"{words[0]} {words[-1]}"
            found[key if key in BOUNDS else words[-1]] = Bound(low, high)
    return found


def test_the_bounds_table_is_the_option_rows_of_domain_bounds() -> None:
    options = {k: v for k, v in BOUNDS.items() if "--" in k}
    assert len(options) > 15
    assert documented_bounds() == options
