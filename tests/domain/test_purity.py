from __future__ import annotations

import ast
from pathlib import Path

import domain

DOMAIN_DIR = Path(domain.__file__).parent


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_domain_modules_import_neither_django_nor_the_ledger() -> None:
    # The domain must stay pure (docs/style.md convention 2): no ORM, no settings, no clock.
    for path in DOMAIN_DIR.glob("*.py"):
        for name in _imports(path):
            root = name.split(".")[0]
            assert root not in {"django", "ledger", "loopsweb"}, f"{path.name}: {name}"


def test_every_domain_module_postpones_annotations() -> None:
    for path in DOMAIN_DIR.glob("*.py"):
        assert "from __future__ import annotations" in path.read_text(), path.name
