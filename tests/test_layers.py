"""The import direction of the code map (README "Code map"): a module imports only from its own
layer or below. Imports are read with `ast` (module level and inside functions alike), so a
lazy import cannot hide a dependency that goes up a layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domain", "loopsweb", "ledger", "routing")

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("domain (pure rules)", ("domain",)),
    ("ledger (record, lock, lifecycle, runner)", ("ledger",)),
    ("admission", ("routing.models", "routing.migrations", "routing.admission")),
    ("drains", ("routing.drains", "routing.tasks")),
    (
        "web surfaces",
        (
            "ledger.admin",
            "routing.admin",
            "routing.api",
            "routing.ops",
            "routing.metrics",
            "routing.templatetags",
        ),
    ),
    ("commands", ("ledger.management", "routing.management")),
    (
        "wiring (settings, urls, app configs)",
        ("loopsweb", "routing.apps", "ledger.apps"),
    ),
)


def layer_of(module: str) -> int | None:
    if module == "routing":  # the package itself: its docstring, no code
        return 0
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def first_party_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, (
                f"{path}: relative import (the layering test needs names)"
            )
            base = node.module or ""
            # `from routing.ops import views` imports routing.ops.views: judge the longest.
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in PACKAGES]


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    missing = [module_name(p) for p in sources() if layer_of(module_name(p)) is None]
    assert missing == []


def test_no_import_goes_up_a_layer() -> None:
    violations = []
    for path in sources():
        mine = layer_of(module_name(path))
        assert mine is not None
        for line, name in first_party_imports(path):
            theirs = layer_of(name)
            if theirs is not None and theirs > mine:
                violations.append(
                    f"{path.relative_to(ROOT)}:{line} imports {name} "
                    f"({LAYERS[theirs][0]}) from {LAYERS[mine][0]}"
                )
    assert violations == [], "\n".join(violations)


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("ledger/services/runs.py", "routing.admission", False),
        ("routing/admission/plan.py", "routing.drains.run", False),
        ("routing/drains/run.py", "routing.ops.selectors", False),
        ("routing/ops/views.py", "routing.drains.configs", True),
        ("ledger/admin/base.py", "ledger.models", True),
    ],
)
def test_the_check_catches_an_upward_import(
    source: str, target: str, allowed: bool
) -> None:
    mine = layer_of(module_name(ROOT / source))
    theirs = layer_of(target)
    assert mine is not None and theirs is not None
    assert (theirs <= mine) is allowed
