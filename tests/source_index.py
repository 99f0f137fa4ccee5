"""The repository's source files, read and parsed once per process, for the suite's rule tests
(tests/test_suite_rules.py, test_layers.py, test_no_message_matching.py, settings_scan.py,
test_docs.py, ...).

Each rule test reads every product or test file and parses it with `ast`; a dozen of them, each
parsing the same five hundred files again, cost `make test-fast` about 20 s of CPU. Here:

- `text(path)`: the file's text, read once while its modification time and size stay the same;
- `parsed(source)`: the syntax tree of a source text, parsed once per text (the cache is keyed by
  the text itself, so a check stays a pure function over source text: a test that feeds it a
  violation gets its own snippet parsed, and an edited file is parsed anew);
- `nodes(source)`: every node of that tree in `ast.walk` order, listed once.

The trees are shared by every check of the process: a check reads them and never changes them
(no `ast.NodeTransformer`, no `fix_missing_locations` on them). Parsing runs with the garbage
collector paused: the hundreds of thousands of nodes a parse makes trigger collection after
collection (each scanning the growing tree), most of a parse's time otherwise.
"""

from __future__ import annotations

import ast
import gc
from pathlib import Path

_texts: dict[Path, tuple[tuple[int, int], str]] = {}
_trees: dict[str, ast.Module] = {}
_nodes: dict[str, list[ast.AST]] = {}


def text(path: Path) -> str:
    """The text of `path` (UTF-8), read again only when its mtime or size changed."""
    status = path.stat()
    stamp = (status.st_mtime_ns, status.st_size)
    known = _texts.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    content = path.read_text(encoding="utf-8")
    _texts[path] = (stamp, content)
    return content


def parsed(source: str, filename: str = "<source>") -> ast.Module:
    """`ast.parse(source, filename)`, once per source text. `filename` only names the file in
    a SyntaxError (which is raised each time, never cached)."""
    tree = _trees.get(source)
    if tree is None:
        collecting = gc.isenabled()
        gc.disable()
        try:
            tree = ast.parse(source, filename)
        finally:
            if collecting:
                gc.enable()
        _trees[source] = tree
    return tree


def nodes(source: str, filename: str = "<source>") -> list[ast.AST]:
    """Every node of `parsed(source)`, in `ast.walk` order (the list is shared: read only)."""
    found = _nodes.get(source)
    if found is None:
        found = list(ast.walk(parsed(source, filename)))
        _nodes[source] = found
    return found
