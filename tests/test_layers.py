"""The structure of the code map (docs/development.md, "Code map"), read from the source with `ast`:

- a module imports only from its own layer or below (module level and inside functions
  alike, so a lazy import cannot hide a dependency that goes up a layer);
- no import cycle: the graph of module imports has no strongly connected component of two
  or more modules;
- no module imports another module's underscore name (`from x import _y`);
- no product module is over 600 lines, and no product function over 80 (migrations
  excluded);
- a drain (`routing.drains.*`) imports admission only through its package, `routing.admission`,
  never one of its submodules (`routing.admission.batch`): drains call its public functions;
- `domain` imports only the standard library and itself (no Django, nothing of loopsweb);
  `agents` only the standard library, `domain` and itself; `ledger` nothing of `runs` or
  `routing` (the one-release shims excepted), and reaches no routing table through a
  reverse relation either (`item.inbox_events`: a query of routing's table no import
  shows), in its code or its templates (templates/admin/ledger/); `runs` nothing of
  `routing`.

Each check is a function over source text, and each has a test that feeds it a violation.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest

from tests import source_index

# One worker runs the checks that parse the sources (tests/source_index.py: each file read and
# parsed once per process, not once per worker).
pytestmark = pytest.mark.xdist_group("source_rules")

ROOT = Path(__file__).resolve().parents[1]
# Modules kept only so rows written by the last release still resolve (ledger/tasks.py):
# the one upward import the ledger may make. Remove with them.
SHIMS = ("ledger.tasks",)
PACKAGES = ("domain", "agents", "loopsweb", "ledger", "runs", "routing")
MAX_LINES = 600

# Lowest first. A module belongs to the layer of the longest prefix that names it. Every
# ledger and runs module is named here: a new one must be given its place. The floors, one
# per directory: domain and agents -> ledger (the record) -> runs (execution) -> routing.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("domain (pure rules)", ("domain",)),
    ("agents (what the CLIs are and print; standard library)", ("agents",)),
    (
        "ledger record (rows, ids, locks, hosts, the run queue, migration rules, the reaper)",
        (
            "ledger.ids",
            "ledger.models",
            "ledger.migrations",
            "ledger.migration_operations",
            "ledger.migration_rules",
            "ledger.migration_checks",
            "ledger.lock",
            "ledger.dberrors",
            "ledger.signals",
            "ledger.hosts",
            "ledger.instances",
            "ledger.queue",
            "ledger.admissions",
            "ledger.claims",
            "ledger.reaper",
        ),
    ),
    (
        "ledger reads (selectors, display, capacity, windows, held secrets)",
        (
            "ledger.selectors",
            "ledger.account_state",
            "ledger.item_read",
            "ledger.display",
            "ledger.capacity",
            "ledger.windows",
            "ledger.held_secrets",
        ),
    ),
    ("ledger services (lifecycle writes)", ("ledger.services",)),
    (
        "ledger web toolkit shared by the admin and /ops (cells, paging, audit)",
        ("ledger.webkit",),
    ),
    ("ledger admin (the record's pages)", ("ledger.admin",)),
    ("ledger commands", ("ledger.management",)),
    ("ledger wiring", ("ledger.apps",)),
    (
        "runs adapters (providers, processes, sandbox, projects, git, GitHub)",
        (
            "runs.sandbox_egress",
            "runs.sandbox",
            "runs.providers",
            "runs.processes",
            "runs.projects",
            "runs.git",
            "runs.github",
            "runs.worktree_files",
            "runs.window_watch",
        ),
    ),
    (
        "runs execution (worktrees, delivery, the runner, the account self-test)",
        (
            "runs.worktrees",
            "runs.worktree_prune",
            "runs.step_commits",
            "runs.delivery_view",
            "runs.pr_body",
            "runs.revision_run",
            "runs.delivery",
            "runs.discard",
            "runs.run_worktree",
            "runs.agent_step",
            "runs.run_signals",
            "runs.step_start",
            "runs.step_process",
            "runs.runner",
            "runs.account_check",
            "runs.confirm",
            "runs.notifications",
        ),
    ),
    (
        "runs tasks (django-q2 entry points, the heartbeat, the cluster's start, checks)",
        ("runs.tasks", "runs.heartbeat", "runs.cluster_start", "runs.checks"),
    ),
    ("admission", ("routing.models", "routing.migrations", "routing.admission")),
    (
        "drains",
        (
            "routing.drains",
            "routing.revisions",
            "routing.github_intake",  # GitHub issues into the inbox
            "routing.github_sync",  # the webhook's polling fallback
            "routing.tasks",
        ),
    ),
    ("reads shared by the web surfaces (API, /ops, /metrics)", ("routing.selectors",)),
    (
        "web surfaces",
        (
            "runs.admin",
            "routing.admin",
            "routing.api",
            "routing.ops",
            "routing.metrics",
            "routing.templatetags",
            "routing.github_hooks",
            # what needs attention, what was delivered: the API's and /ops' lists
            "routing.worklists",
        ),
    ),
    ("commands", ("runs.management", "routing.management")),
    (
        "wiring (settings, urls, app configs)",
        ("loopsweb", "routing.apps", "runs.apps"),
    ),
    # Dotted task paths stored in django-q2 rows before the move to runs/: one release.
    ("shims", SHIMS),
)


def layer_of(module: str) -> int | None:
    if module in ("agents", "ledger", "runs", "routing"):  # a docstring, no code
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


def imports(source: str, filename: str = "<source>") -> list[tuple[int, str, str]]:
    """Every import as (line, module, imported name): `import a.b` is ("a.b", ""), `from a
    import b` is ("a", "b"). Module level and inside functions alike."""
    found: list[tuple[int, str, str]] = []
    for node in source_index.nodes(source, filename):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, (
                f"{filename}: relative import (the layering test needs names)"
            )
            found += [(node.lineno, node.module or "", a.name) for a in node.names]
    return found


def first_party_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for line, module, name in imports(source_index.text(path), str(path)):
        # `from routing.ops import views` imports routing.ops.views: judge the longest.
        full = f"{module}.{name}" if name else module
        if full.split(".")[0] in PACKAGES:
            found.append((line, full))
    return found


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def product_sources() -> list[Path]:
    return [p for p in sources() if "migrations" not in p.relative_to(ROOT).parts]


# --- import graph and cycles --------------------------------------------------------------------


def import_graph(modules: Mapping[str, str]) -> dict[str, set[str]]:
    """module -> the modules of `modules` it imports (module name -> source text).

    An import names the longest module it reaches (`from ledger.models import Account` is
    `ledger.models`; `from ledger import services` is `ledger.services`). A package's
    `__init__` is not counted for an import of one of its submodules: re-exporting
    submodules from their package is no cycle.
    """

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, source in modules.items():
        targets = set()
        for _, imported, name in imports(source, module):
            target = resolve(f"{imported}.{name}" if name else imported)
            if target is not None and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def import_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


# --- single-file checks -------------------------------------------------------------------------


def underscore_imports(source: str, filename: str = "<source>") -> list[str]:
    """`from x import _y` with x first-party: a module reaching into another's privates."""
    return [
        f"{filename}:{line} imports {name} from {module}"
        for line, module, name in imports(source, filename)
        if module.split(".")[0] in PACKAGES
        and name.startswith("_")
        and not (name.startswith("__") and name.endswith("__"))
    ]


def foreign_imports(
    source: str, allowed: Callable[[str], bool], filename: str = "<source>"
) -> list[str]:
    """Imports whose module `allowed` refuses (judged by the imported module's full name)."""
    return [
        f"{filename}:{line} imports {module}"
        for line, module, _ in imports(source, filename)
        if not allowed(module)
    ]


def domain_may_import(module: str) -> bool:
    top = module.split(".")[0]
    return top == "domain" or top in sys.stdlib_module_names


def ledger_may_import(module: str) -> bool:
    return module.split(".")[0] not in ("routing", "runs")


def agents_may_import(module: str) -> bool:
    top = module.split(".")[0]
    return top in ("agents", "domain") or top in sys.stdlib_module_names


def admission_submodules() -> set[str]:
    """The submodules of routing.admission (`batch`, `plan`, ...), read from the tree."""
    folder = ROOT / "routing" / "admission"
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}


def admission_submodule_imports(
    source: str, submodules: set[str], filename: str = "<source>"
) -> list[str]:
    """Imports that reach a `routing.admission.<submodule>` (`import routing.admission.plan`,
    `from routing.admission.batch import x`, `from routing.admission import batch`)."""
    found: list[tuple[int, str]] = []
    for line, module, name in imports(source, filename):
        full = f"{module}.{name}" if name else module
        if module.startswith("routing.admission.") or (
            module == "routing.admission" and name in submodules
        ):
            found.append((line, f"{filename}:{line} imports {full}"))
    return [text for _, text in sorted(found)]


def too_long(text: str, limit: int = MAX_LINES) -> bool:
    return len(text.splitlines()) > limit


# --- the tree -----------------------------------------------------------------------------------


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


def test_no_package_has_an_import_cycle() -> None:
    graph = import_graph({module_name(p): source_index.text(p) for p in sources()})
    assert import_cycles(graph) == []


def test_no_module_imports_another_module_s_underscore_name() -> None:
    violations = [
        v
        for path in sources()
        for v in underscore_imports(
            source_index.text(path), str(path.relative_to(ROOT))
        )
    ]
    assert violations == [], "\n".join(violations)


def test_no_product_module_is_over_600_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {len(source_index.text(path).splitlines())} lines"
        for path in product_sources()
        if too_long(source_index.text(path))
    ]
    assert long == [], "\n".join(long)


# No product function grows past MAX_FUNCTION_LINES (migrations excluded, as for modules).
MAX_FUNCTION_LINES = 80


def long_functions(source: str, where: str) -> list[str]:
    """`where:line name (N lines)` for each function of `source` over MAX_FUNCTION_LINES."""
    return [
        f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in source_index.nodes(source)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_product_function_is_over_80_lines() -> None:
    found = [
        v
        for path in product_sources()
        for v in long_functions(source_index.text(path), str(path.relative_to(ROOT)))
    ]
    assert found == [], "\n".join(found)


def test_the_check_catches_a_function_over_80_lines() -> None:
    body = "    x = 1\n" * (MAX_FUNCTION_LINES - 1)
    assert long_functions(f"def f():\n{body}", "x.py") == []
    assert long_functions(f"def f():\n{body}    y = 2\n", "x.py") == [
        "x.py:1 f (81 lines)"
    ]


def test_domain_imports_only_the_standard_library_and_itself() -> None:
    violations = [
        v
        for path in sorted((ROOT / "domain").rglob("*.py"))
        for v in foreign_imports(
            source_index.text(path), domain_may_import, str(path.relative_to(ROOT))
        )
    ]
    assert violations == [], "\n".join(violations)


def test_agents_import_only_the_standard_library_domain_and_themselves() -> None:
    violations = [
        v
        for path in sorted((ROOT / "agents").rglob("*.py"))
        for v in foreign_imports(
            source_index.text(path), agents_may_import, str(path.relative_to(ROOT))
        )
    ]
    assert violations == [], "\n".join(violations)


def test_ledger_imports_nothing_above_it() -> None:
    """Neither `runs` (execution) nor `routing`: the shims excepted (SHIMS)."""
    violations = [
        v
        for path in sorted((ROOT / "ledger").rglob("*.py"))
        if module_name(path) not in SHIMS
        for v in foreign_imports(
            source_index.text(path), ledger_may_import, str(path.relative_to(ROOT))
        )
    ]
    assert violations == [], "\n".join(violations)


def runs_may_import(module: str) -> bool:
    return module.split(".")[0] != "routing"


def test_runs_import_nothing_of_routing() -> None:
    violations = [
        v
        for path in sorted((ROOT / "runs").rglob("*.py"))
        for v in foreign_imports(
            source_index.text(path), runs_may_import, str(path.relative_to(ROOT))
        )
    ]
    assert violations == [], "\n".join(violations)


def test_drains_import_admission_only_through_its_package() -> None:
    submodules = admission_submodules()
    assert {"batch", "plan", "transaction"} <= submodules
    violations = [
        v
        for path in sorted((ROOT / "routing" / "drains").rglob("*.py"))
        for v in admission_submodule_imports(
            source_index.text(path), submodules, str(path.relative_to(ROOT))
        )
    ]
    assert violations == [], "\n".join(violations)


def routing_reverse_names() -> set[str]:
    """The reverse accessors routing's models give ledger's rows: each ForeignKey's or
    OneToOneField's `related_name` in routing/models.py (and the default `<model>_set`)."""
    names = set()
    for node in source_index.nodes(source_index.text(ROOT / "routing" / "models.py")):
        if isinstance(node, ast.ClassDef):
            names.add(f"{node.name.lower()}_set")
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "related_name" and isinstance(
                    keyword.value, ast.Constant
                ):
                    names.add(str(keyword.value.value))
    return names - {"+"}


def reverse_reads(source: str, names: set[str], path: str) -> list[str]:
    """`path:line reads .<name>` for each attribute named like a routing reverse accessor."""
    return [
        f"{path}:{node.lineno} reads .{node.attr}"
        for node in source_index.nodes(source)
        if isinstance(node, ast.Attribute) and node.attr in names
    ]


def test_ledger_reaches_no_routing_table_through_a_reverse_relation() -> None:
    names = routing_reverse_names()
    assert "inbox_events" in names
    violations = [
        v
        for path in sorted((ROOT / "ledger").rglob("*.py"))
        for v in reverse_reads(
            source_index.text(path), names, str(path.relative_to(ROOT))
        )
    ]
    for path in sorted((ROOT / "templates" / "admin" / "ledger").rglob("*.html")):
        text = path.read_text()
        violations += [
            f"{path.relative_to(ROOT)} reads .{name}"
            for name in sorted(names)
            if f".{name}" in text
        ]
    assert violations == [], "\n".join(violations)


# --- each check catches what it is for ----------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("ledger/services/runs.py", "routing.admission", False),
        ("routing/admission/plan.py", "routing.drains.run", False),
        ("routing/drains/run.py", "routing.ops.selectors", False),
        ("routing/ops/views.py", "routing.drains.configs", True),
        ("ledger/admin/base.py", "ledger.models", True),
        # ledger's inner floors
        ("ledger/services/retries.py", "runs.tasks", False),
        ("ledger/services/runs.py", "runs.runner", False),
        ("ledger/services/loops.py", "ledger.queue", True),
        ("runs/worktrees.py", "ledger.services", True),
        ("runs/runner.py", "runs.processes", True),
        ("runs/processes.py", "runs.runner", False),
        ("ledger/models/runs.py", "ledger.selectors", False),
        ("ledger/selectors.py", "ledger.services", False),
        ("ledger/queue.py", "ledger.services", False),
        ("runs/tasks.py", "runs.admin", False),
        # the floors: agents -> ledger -> runs
        ("agents/ratelimit.py", "ledger.models", False),
        ("ledger/admin/base.py", "runs.delivery", False),
        ("ledger/services/runs.py", "ledger.reaper", True),
        ("runs/runner.py", "agents.agent_output", True),
    ],
)
def test_the_check_catches_an_upward_import(
    source: str, target: str, allowed: bool
) -> None:
    mine = layer_of(module_name(ROOT / source))
    theirs = layer_of(target)
    assert mine is not None and theirs is not None
    assert (theirs <= mine) is allowed


def test_the_check_catches_an_import_cycle_lazy_imports_included() -> None:
    modules = {
        "ledger.a": "from ledger.b import thing\n",
        "ledger.b": "def f() -> None:\n    from ledger.c import other\n",
        "ledger.c": "import ledger.a\n",
        "ledger.d": "from ledger.a import thing\n",  # points into the cycle, not part of it
        "ledger.pkg": "from ledger.pkg.sub import name\n",  # a package re-exporting
        "ledger.pkg.sub": "from ledger.a import thing\n",
    }
    assert import_cycles(import_graph(modules)) == [
        ["ledger.a", "ledger.b", "ledger.c"]
    ]
    del modules["ledger.c"]
    assert import_cycles(import_graph(modules)) == []


def test_the_check_catches_an_underscore_import() -> None:
    source = (
        "from ledger.services.common import _append_event, append_event\n"
        "from routing.drains import outcomes\n"
        "from django.db import _private\n"  # a third party's private: not this check's
        "from ledger import __doc__\n"
    )
    assert underscore_imports(source, "x.py") == [
        "x.py:1 imports _append_event from ledger.services.common"
    ]


def test_the_check_catches_a_module_over_600_lines() -> None:
    assert not too_long("x = 1\n" * MAX_LINES)
    assert too_long("x = 1\n" * (MAX_LINES + 1))


def test_the_check_catches_domain_importing_django_or_loopsweb() -> None:
    source = (
        "import json\n"
        "from dataclasses import dataclass\n"
        "from domain.keys import TODOS_TASK\n"
        "import django.db\n"
        "def f() -> None:\n"
        "    from ledger.models import WorkflowRun\n"
    )
    assert foreign_imports(source, domain_may_import, "d.py") == [
        "d.py:4 imports django.db",
        "d.py:6 imports ledger.models",
    ]


def test_the_check_catches_ledger_importing_routing_or_runs() -> None:
    source = (
        "from domain.keys import TODOS_TASK\nimport routing.models\n"
        "from agents.usage import Usage\nfrom runs.runner import run_workflow_run\n"
    )
    assert foreign_imports(source, ledger_may_import, "l.py") == [
        "l.py:2 imports routing.models",
        "l.py:4 imports runs.runner",
    ]


def test_the_check_catches_agents_importing_django_or_the_ledger() -> None:
    source = "import re\nfrom domain.pool import x\nfrom django.conf import settings\n"
    source += "from ledger.models import Account\n"
    assert foreign_imports(source, agents_may_import, "a.py") == [
        "a.py:3 imports django.conf",
        "a.py:4 imports ledger.models",
    ]


def test_the_check_catches_a_drain_importing_an_admission_submodule() -> None:
    source = (
        "from routing.admission import RoutePlan, admit_batch\n"
        "from routing.admission.batch import holds_without_lock\n"
        "def f() -> None:\n"
        "    import routing.admission.plan\n"
        "from routing.admission import decide\n"
        "from routing.models import InboxEvent\n"
    )
    assert admission_submodule_imports(source, admission_submodules(), "d.py") == [
        "d.py:2 imports routing.admission.batch.holds_without_lock",
        "d.py:4 imports routing.admission.plan",
        "d.py:5 imports routing.admission.decide",
    ]


def test_the_check_catches_a_reverse_read_of_a_routing_table() -> None:
    source = "def page(item):\n    return list(item.inbox_events.all())\n"
    assert reverse_reads(source, routing_reverse_names(), "l.py") == [
        "l.py:2 reads .inbox_events"
    ]
