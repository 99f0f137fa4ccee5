"""docs/settings.md is true to the code (issue 42 item 7), as tests/test_readme_options.py keeps
the option tables: every variable the code reads has a row and every row is a variable the
code reads; a row's range is the variable's row of `domain/bounds.py`, and a plain default is
the one `deploy/loopsweb.env.example` gives (tests/test_serve.py keeps that file's defaults
equal to the code's). Read from the sources, no database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from domain.bounds import BOUNDS, Bound
from tests.settings_scan import NOT_SETTINGS, settings_read_by_code

# One worker runs the checks that parse the sources (tests/source_index.py: each file read and
# parsed once per process, not once per worker).
pytestmark = pytest.mark.xdist_group("source_rules")

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "settings.md"
TEMPLATE = ROOT / "deploy" / "loopsweb.env.example"
PROVIDER = "<PROVIDER>"
# The bounds row of every provider's rate-limit exit codes (one row for all of them).
EXIT_CODES = "rate-limit exit code"
NO_RANGE = "—"
UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
NUMBER = r"(\d[\d,]*)(?:\s*(KiB|MiB|GiB))?"
RANGE = re.compile(rf"^(?:each )?{NUMBER} – {NUMBER}$")


@dataclass(frozen=True)
class Row:
    names: tuple[str, ...]
    default: str
    range: str
    pattern: bool  # names a LOOPSWEB_<PROVIDER>_... family


def providers() -> list[str]:
    return [p.upper() for p in settings.LOOPSWEB_PROVIDER_BINARIES]


def rows(text: str) -> list[Row]:
    found = []
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a settings row has four cells: {line}"
        names: list[str] = []
        pattern = False
        for name in re.findall(r"`([A-Z][A-Z0-9_<>]*)`", cells[0]):
            if PROVIDER in name:
                pattern = True
                names += [name.replace(PROVIDER, p) for p in providers()]
            else:
                names.append(name)
        found.append(Row(tuple(names), cells[1], cells[2], pattern))
    return found


def parse_range(text: str) -> Bound | None:
    if text == NO_RANGE:
        return None
    match = RANGE.match(text)
    assert match, f"a range reads `low – high` (or {NO_RANGE}): {text!r}"

    def number(digits: str, unit: str | None) -> int:
        return int(digits.replace(",", "")) * UNITS.get(unit or "", 1)

    low, low_unit, high, high_unit = match.groups()
    return Bound(number(low, low_unit), number(high, high_unit))


def template_defaults() -> dict[str, str]:
    """NAME -> value of the environment template's `#NAME=value` lines."""
    found = {}
    for line in TEMPLATE.read_text().splitlines():
        match = re.match(r"^#?([A-Z][A-Z0-9_]*)=(.*)$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def documented() -> dict[str, Row]:
    table: dict[str, Row] = {}
    for row in rows(PAGE.read_text(encoding="utf-8")):
        for name in row.names:
            assert name not in table, f"{name} has two rows"
            table[name] = row
    return table


def test_every_setting_the_code_reads_has_a_row_and_every_row_is_read() -> None:
    table = documented()
    read = settings_read_by_code()
    assert len(table) > 60  # the page was parsed
    assert sorted(read - set(table)) == [], "read by the code, missing from the page"
    # per-process variables (NOT_SETTINGS) may be documented too
    assert sorted(set(table) - read - set(NOT_SETTINGS)) == [], "no code reads these"


def test_every_range_is_its_bounds_row_and_every_bounded_setting_has_one() -> None:
    table = documented()
    for name, row in table.items():
        key = EXIT_CODES if row.pattern and name.endswith("_EXIT_CODES") else name
        assert parse_range(row.range) == BOUNDS.get(key), name
    setting_rows = {k for k in BOUNDS if k.isupper() and not k.startswith("-")}
    assert sorted(setting_rows - set(table)) == []


def test_plain_defaults_are_the_environment_templates() -> None:
    table = documented()
    template = template_defaults()
    checked = 0
    for name, row in table.items():
        plain = re.fullmatch(r"`([^`]+)`(?: \([^)]*\))?", row.default)
        if plain and name in template and template[name]:
            assert plain.group(1) == template[name], name
            checked += 1
    assert checked > 30


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("1 – 3,600", Bound(1, 3600)),
        ("1,024 – 64 MiB", Bound(1024, 64 * 1024**2)),
        ("each 0 – 255", Bound(0, 255)),
        (NO_RANGE, None),
    ],
)
def test_the_range_reader(text: str, bound: Bound | None) -> None:
    assert parse_range(text) == bound


def test_a_row_the_code_does_not_read_is_caught() -> None:
    extra = "| `LOOPSWEB_NOT_A_SETTING` | `1` | — | nothing |\n"
    assert rows(extra)[0].names == ("LOOPSWEB_NOT_A_SETTING",)
    assert "LOOPSWEB_NOT_A_SETTING" not in settings_read_by_code()
