"""The suite's own rules (issue 37: a suite that tells the truth on a busy machine).

No test outside tests/bench/ asserts that a measured duration is below a bound shorter than a
hang deadline (tests/waiting.MIN_HANG_SECONDS, 60 s). On a busy 2-core machine such an
assertion fails though nothing is wrong ("opencode took 30 s"); how long things take is a
benchmark's figure (tests/bench/, `make bench`), and a test asserts the outcome and the
order of events instead, waiting with tests/waiting.wait_for.

The check reads every test file's syntax tree. An `assert` is a timing assertion when one of
its comparisons puts an upper bound (`<`, `<=`, or `>`, `>=` the other way round) on a
measured duration, and the bound is known statically to be under 60 s:
- measured: a name or attribute such as `elapsed`, `took`, `seconds`, `duration_ms`,
  `latency`, `moved_after`; a subtraction involving a clock read (`time.monotonic()`,
  `time.time()`, `perf_counter()`, `timezone.now()`, `datetime.now()`), anywhere inside the
  compared expression; or a subtraction of two timestamps (`x.stopped - x.started`,
  `b.finished_at - a.started_at`);
- the bound: a number (milliseconds when the measured name says `ms`), `timedelta(...)` of
  numbers, arithmetic on them, and names bound to such a value once in the same function or
  at module level (`dead = 20` ... `moved_after <= dead + 30`). A bound computed at run time
  (`hang_deadline(...)`, an attribute) is not judged.
Lower bounds (`elapsed >= 1.5`: it waited at least) are correctness, and allowed.

`test_the_checker_catches_the_old_timing_assertions` runs the check on the assertions the
suite had before issue 37 (`assert done.seconds < 30, f"{provider} took {done.seconds:.0f} s"`
among them) and on ones it must accept. Run over the whole suite as it was before issue 37
(commit 1cd47f7), the check names 14 assertions in 7 files, each one an upper bound under a
minute on a duration (test_real_clis.py:167 the one that failed); the bounds it leaves
alone there are a minute or more (`failed_after <= lease + 60` with lease 30, `< 60`,
`< 120`).

No file under tests/ silences the type checker with a comment: no `# type: ignore` (with or
without error codes) and no `# mypy:` inline configuration (`ignore-errors`,
`disable-error-code`). The suite's shared helpers are in mypy's scope (pyproject.toml); a
test module is not, and an ignore there only hides what a typed helper, an `assert x is not
None` or a typed fixture (`pytest_django.Settings`, `pytest.CaptureFixture[str]`) says
plainly. The check reads comments only (the tokenizer's), so a string naming the comment,
as here, is not one.

No file under tests/ imports a test module (`test_*.py`): not `from tests.agents.test_runs_real
import drain_and_run`, `import tests.test_serve`, `from tests.routing.ops import test_admin`,
`from .test_delivery import forge` or `import_module("tests.ledger.test_delivery")`, and not
in the code it hands a Python child with `-c` (`[python, "-c", "from tests.ledger.test_upgrade
import rollback_probe; rollback_probe()"]`, parsed as code). A test module holds tests:
importing one makes its helpers and fixtures a second module's API and ties the two files,
so neither can move or change on its own. What tests share is in a helper module, not named
`test_*` (tests/agents/real_runs.py, tests/ledger/delivery_helpers.py,
tests/routing/helpers.py, ...), a fixture in the nearest conftest.py. The check reads the
syntax tree, so a string that only names such an import, as here, is not one.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests import source_index
from tests.waiting import MIN_HANG_SECONDS, TIME_SCALE_ENV

# One worker runs the checks that parse the sources (tests/source_index.py: each file read and
# parsed once per process, not once per worker).
pytestmark = [
    pytest.mark.sqlite,  # reads files only: one suite runs it
    pytest.mark.xdist_group("source_rules"),
]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

_MEASURED_NAME = re.compile(
    r"(^|_)(elapsed|took|seconds|secs|duration|latency|wall)(_|$)|_after$",
    re.IGNORECASE,
)
_TIMESTAMP_NAME = re.compile(
    r"(^|_)(started|stopped|finished|began|begun|ended|killed|start|end|at|due)$",
    re.IGNORECASE,
)
_CLOCKS = {"monotonic", "perf_counter", "time", "now", "monotonic_ns", "time_ns"}
_MS = re.compile(r"(^|_)ms$|_ms_|millis", re.IGNORECASE)
# timedelta's positional arguments, in order, in seconds
_TIMEDELTA_POSITIONAL = (86400.0, 1.0, 0.000001, 0.001, 60.0, 3600.0, 604800.0)
_TIMEDELTA_UNITS = {
    "weeks": 604800.0,
    "days": 86400.0,
    "hours": 3600.0,
    "minutes": 60.0,
    "seconds": 1.0,
    "milliseconds": 0.001,
    "microseconds": 0.000001,
}


def _identifier(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_clock_read(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = _identifier(func)
    if name not in _CLOCKS:
        return False
    # time.time(), time.monotonic(), timezone.now(), datetime.now(UTC), bare monotonic()
    owner = _identifier(func.value) if isinstance(func, ast.Attribute) else None
    return name != "time" or owner == "time"


def _is_measured(node: ast.AST) -> bool:
    """Whether `node` is (or contains) a measured duration."""
    name = _identifier(node)
    if name is not None and _MEASURED_NAME.search(name):
        return True
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub):
            sides = (sub.left, sub.right)
            if any(_is_clock_read(s) for side in sides for s in ast.walk(side)):
                return True
            names = [_identifier(side) for side in sides]
            if all(n is not None and _TIMESTAMP_NAME.search(n) for n in names):
                return True
    return False


def _in_milliseconds(node: ast.AST) -> bool:
    return any(
        (n := _identifier(sub)) is not None and _MS.search(n) for sub in ast.walk(node)
    )


class _Bounds:
    """Static values of the numeric names a bound may use: module level and per function,
    names assigned exactly once to something evaluable."""

    def __init__(self, scopes: list[ast.AST]) -> None:
        self.values: dict[str, float] = {}
        counts: dict[str, int] = {}
        found: dict[str, ast.AST] = {}
        for scope in scopes:
            for node in _own_statements(scope):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            counts[target.id] = counts.get(target.id, 0) + 1
                            found[target.id] = node.value
                elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                    if isinstance(node.target, ast.Name):
                        counts[node.target.id] = counts.get(node.target.id, 0) + 2
        for name, value in found.items():
            if counts[name] == 1:
                number = self.evaluate(value)
                if number is not None:
                    self.values[name] = number

    def evaluate(self, node: ast.AST) -> float | None:
        """Seconds (or a plain number) when known statically, else None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            if isinstance(node.value, bool):
                return None
            return float(node.value)
        if isinstance(node, ast.Name):
            return self.values.get(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.evaluate(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.BinOp):
            left, right = self.evaluate(node.left), self.evaluate(node.right)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Div) and right:
                return left / right
            return None
        if isinstance(node, ast.Call) and _identifier(node.func) == "timedelta":
            total = 0.0
            for index, arg in enumerate(node.args):
                value = self.evaluate(arg)
                if value is None or index >= len(_TIMEDELTA_POSITIONAL):
                    return None
                total += value * _TIMEDELTA_POSITIONAL[index]
            for keyword in node.keywords:
                unit = _TIMEDELTA_UNITS.get(keyword.arg or "")
                value = self.evaluate(keyword.value)
                if unit is None or value is None:
                    return None
                total += value * unit
            return total
        return None


# The fields that hold statements (`except` clauses and `case`s hold them in turn). No
# expression holds a statement, so the statements of a scope are reached through these alone.
_BODIES = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})


def _inner_statements(node: ast.AST) -> list[ast.AST]:
    """The statements (and `except` clauses, `case`s) right inside `node`, in field order."""
    return [
        child
        for field in node._fields
        if field in _BODIES and isinstance(children := getattr(node, field), list)
        for child in children
    ]


def _own_statements(scope: ast.AST) -> list[ast.AST]:
    """The statements of a module or function, not those of functions nested in it."""
    out: list[ast.AST] = []
    todo = _inner_statements(scope)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        out.append(node)
        todo.extend(_inner_statements(node))
    return out


def _upper_bounds(compare: ast.Compare) -> list[tuple[ast.AST, ast.AST]]:
    """(measured side, bound side) of each comparison in `compare` that caps its left
    operand (`a < b`, `a <= b`) or its right one (`a > b`, `a >= b`)."""
    pairs: list[tuple[ast.AST, ast.AST]] = []
    operands = [compare.left, *compare.comparators]
    for index, op in enumerate(compare.ops):
        left, right = operands[index], operands[index + 1]
        if isinstance(op, ast.Lt | ast.LtE):
            pairs.append((left, right))
        elif isinstance(op, ast.Gt | ast.GtE):
            pairs.append((right, left))
    return pairs


def timing_assertions(source: str, filename: str = "<test>") -> list[str]:
    """`file:line: source` of each assertion in `source` that caps a measured duration
    under a hang deadline."""
    tree = source_index.parsed(source, filename)
    found: list[str] = []
    functions: list[ast.AST] = [
        node
        for node in source_index.nodes(source, filename)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    module = _Bounds([tree])

    def check(scope: ast.AST, bounds: _Bounds) -> None:
        for node in _own_statements(scope):
            if not isinstance(node, ast.Assert):
                continue
            for compare in ast.walk(node.test):
                if not isinstance(compare, ast.Compare):
                    continue
                for measured, bound in _upper_bounds(compare):
                    if not _is_measured(measured):
                        continue
                    value = bounds.evaluate(bound)
                    if value is None:
                        continue
                    if _in_milliseconds(measured):
                        value /= 1000
                    if value < MIN_HANG_SECONDS:
                        segment = ast.get_source_segment(source, node) or ""
                        found.append(
                            f"{filename}:{node.lineno}: {segment.splitlines()[0]}"
                        )
                        break

    check(tree, module)
    for function in functions:
        local = _Bounds([function])
        merged = _Bounds([])
        merged.values = {**module.values, **local.values}
        check(function, merged)
    return found


def _test_files() -> list[Path]:
    bench = TESTS / "bench"
    return sorted(
        p for p in TESTS.rglob("*.py") if bench not in p.parents and p.is_file()
    )


def test_no_test_asserts_a_duration_shorter_than_a_hang_deadline() -> None:
    found = []
    for path in _test_files():
        found += timing_assertions(source_index.text(path), str(path.relative_to(ROOT)))
    assert found == [], (
        "timing assertions (assert the outcome or the order of events instead, and put "
        "the figure in tests/bench/):\n" + "\n".join(found)
    )


def _one(body: str) -> str:
    return "def test_x():\n" + "".join(f"    {line}\n" for line in body.splitlines())


@pytest.mark.parametrize(
    "body",
    [
        # The assertion that failed on the busy machine (tests/agents/test_real_clis.py).
        'assert done.seconds < 30, f"{provider} took {done.seconds:.0f} s"',
        "assert done.exit_code == 1 and done.seconds < 30",
        "started = time.monotonic()\nrun()\nassert time.monotonic() - started < 30",
        "elapsed = time.monotonic() - started\nassert 1.5 <= elapsed < 8",
        "assert worker.exit_code is None and 1200 <= worker.duration_ms < 6000",
        "assert silent.duration_ms < 4000",
        "assert elapsed < 5",
        "assert abs((b_until - timezone.now()).total_seconds() - 300) < 30",
        "dead = 20\nassert moved_after <= dead + 30, moved_after",
        "assert restarted_after < 60 - 1",
        "assert drain_task.stopped - drain_task.started <= timedelta(seconds=15)",
        "assert drain_task.started - due <= timedelta(seconds=40)",
        "assert 10 > time.time() - began",
    ],
)
def test_the_checker_catches_the_old_timing_assertions(body: str) -> None:
    assert len(timing_assertions(_one(body))) == 1, body


@pytest.mark.parametrize(
    "body",
    [
        "assert time.monotonic() - started >= 1.5",  # a lower bound: it waited
        "assert steps['chatty'].duration_ms >= 1500",
        "assert 1200 <= worker.duration_ms < AGENT_OWN_END * 1000",  # not static
        "assert time.monotonic() - started < hang_deadline(120)",
        "assert moved_after <= 300",  # a hang deadline
        "assert silent.duration_ms < 120_000",
        "assert done.ended_at < first_429 + stand_in.retry_after",  # an ordering
        "assert before + timedelta(minutes=5) <= until <= after + timedelta(minutes=5)",
        "assert 240 < cooling['remainingSeconds'] <= 300",
        "assert failed.finished_at - failed.host_wait_since >= timedelta(seconds=20)",
        "assert len(results) < 5",
        "assert q['timeout'] < q['retry']",
    ],
)
def test_the_checker_accepts_outcomes_orders_and_hang_deadlines(body: str) -> None:
    assert timing_assertions(_one(body)) == [], body


# A comment that is (or, after a noqa, holds) the type-ignore marker, with or without error
# codes, or a `mypy:` inline configuration.
_SILENCER = re.compile(r"#\s*type\s*:\s*ignore\b|^#\s*mypy\s*:", re.IGNORECASE)
# The same anywhere in a file's text: every comment is a piece of its line, so a file this
# finds nothing in has no such comment, and is not tokenized (most of the check's time).
_SILENCER_ANYWHERE = re.compile(r"#\s*type\s*:\s*ignore\b|#\s*mypy\s*:", re.IGNORECASE)


def type_check_silencers(source: str, filename: str = "<test>") -> list[str]:
    """`file:line: comment` of each comment in `source` that silences the type checker."""
    if not _SILENCER_ANYWHERE.search(source):
        return []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [
        f"{filename}:{token.start[0]}: {token.string}"
        for token in tokens
        if token.type == tokenize.COMMENT and _SILENCER.search(token.string)
    ]


def test_no_file_under_tests_silences_the_type_checker() -> None:
    found = []
    for path in sorted(p for p in TESTS.rglob("*.py") if p.is_file()):
        found += type_check_silencers(
            source_index.text(path), str(path.relative_to(ROOT))
        )
    assert found == [], (
        "type-checker silencers (type the helper, narrow with `assert x is not None` or "
        "`isinstance`, annotate the fixture; don't silence it):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "line",
    [
        "x = f()  # type: ignore",
        "x = f()  # type: ignore[union-attr]",
        "x = f()  #type:ignore[arg-type, attr-defined]",
        "x = f()  # noqa: E501  # type: ignore[arg-type]",
        "def f(a, b):  # TYPE: IGNORE",
        "# mypy: ignore-errors",
        "# mypy: disable-error-code=union-attr",
    ],
)
def test_the_silencer_check_finds_the_comments(line: str) -> None:
    assert len(type_check_silencers(line + "\n")) == 1, line


@pytest.mark.parametrize(
    "line",
    [
        'note = "# type: ignore is refused under tests/"',
        "x = cast(int, f())  # the value is known to be an int",
        "# the type: ignored here is a word, not the comment",
        "# see the mypy docs",
    ],
)
def test_the_silencer_check_leaves_strings_and_other_comments(line: str) -> None:
    assert type_check_silencers(line + "\n") == [], line


def test_only_the_waiting_module_reads_the_time_scale() -> None:
    readers = [
        str(p.relative_to(ROOT))
        for p in _test_files()
        if TIME_SCALE_ENV in source_index.text(p)
    ]
    assert readers == ["tests/waiting.py"], readers


# A test module: `test_*.py`, named as the last part of a dotted module path.
_TEST_MODULE = re.compile(r"(^|\.)test_\w*$")


def _child_code(node: ast.AST) -> list[str]:
    """The code strings `node` hands to a Python child with `-c` (`[python, "-c", CODE]`,
    `run(python, "-c", CODE)`)."""
    if isinstance(node, ast.List | ast.Tuple):
        items = node.elts
    elif isinstance(node, ast.Call):
        items = node.args
    else:
        return []
    return [
        code.value
        for flag, code in zip(items, items[1:], strict=False)
        if isinstance(flag, ast.Constant)
        and flag.value == "-c"
        and isinstance(code, ast.Constant)
        and isinstance(code.value, str)
    ]


def _imported_test_modules(node: ast.AST) -> list[str]:
    """The test modules `node` imports: an import statement, an `import_module` or
    `__import__` call on a literal, or code it hands to a child with `-c`."""
    found: list[str] = []
    if isinstance(node, ast.Import):
        found += [a.name for a in node.names if _TEST_MODULE.search(a.name)]
    elif isinstance(node, ast.ImportFrom):
        module = "." * node.level + (node.module or "")
        if _TEST_MODULE.search(module):
            found.append(module)
        else:  # `from tests.routing.ops import test_admin`: the name is a module
            sep = "" if module.endswith(".") else "."
            found += [
                f"{module}{sep}{a.name}"
                for a in node.names
                if a.name.startswith("test_")
            ]
    elif (
        isinstance(node, ast.Call)
        and _identifier(node.func) in {"import_module", "__import__"}
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and _TEST_MODULE.search(node.args[0].value)
    ):
        found.append(node.args[0].value)
    for code in _child_code(node):
        try:
            child = ast.parse(code)
        except SyntaxError:
            continue
        found += [m for sub in ast.walk(child) for m in _imported_test_modules(sub)]
    return found


def imports_of_test_modules(source: str, filename: str = "<test>") -> list[str]:
    """`file:line: module` of each import of a test module in `source`."""
    return [
        f"{filename}:{getattr(node, 'lineno', 0)}: {module}"
        for node in source_index.nodes(source, filename)
        for module in _imported_test_modules(node)
    ]


def test_no_test_module_imports_another_test_module() -> None:
    found = []
    for path in sorted(p for p in TESTS.rglob("*.py") if p.is_file()):
        found += imports_of_test_modules(
            source_index.text(path), str(path.relative_to(ROOT))
        )
    assert found == [], (
        "imports of a test module (move what is shared to a helper module, or a fixture "
        "to the nearest conftest.py, and import it from there):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        # The imports the suite had (tests/agents/, tests/routing/, tests/ledger/).
        "from tests.agents.test_runs_real import _run_env, _task",
        "from tests.routing.ops.test_admin import ITEMS, RUNS, admitted",
        "from tests.test_serve import NOT_SETTINGS, settings_read_by_code",
        "def test_x():\n    from tests.routing.drains.test_batch import _ledger, _wipe",
        "import tests.test_properties",
        "import tests.test_properties as properties",
        "from tests.routing.ops import test_admin",
        "from .test_delivery import forge",
        "from . import test_delivery",
        'importlib.import_module("tests.ledger.test_delivery")',
        # Code a child process runs (tests/ledger/test_upgrade.py's probe).
        'run([sys.executable, "-c", "from tests.ledger.test_upgrade import probe; probe()"])',
        'subprocess.run((python, "-c", "import tests.ledger.test_upgrade"))',
        'Popen([python, "-u", "-c", "import json\\nfrom tests.test_serve import ENV"])',
    ],
)
def test_the_import_check_finds_imports_of_test_modules(source: str) -> None:
    assert len(imports_of_test_modules(source + "\n")) == 1, source


@pytest.mark.parametrize(
    "source",
    [
        "from tests.agents.real_runs import KEYS, drain_and_run",
        "from tests.ledger import runner_helpers",
        "from tests.routing.ops import seed as ops_seed",
        "import tests.waiting",
        "from tests.ledger.conftest import agent",
        'note = "the tests in tests/ledger/test_delivery.py"',
        'example = "from tests.ledger.test_delivery import forge"',  # a string, not code
        'run([python, "-c", "from tests.ledger.upgrade_probe import probe; probe()"])',
        'importlib.import_module("ledger.migrations.0023_step_reason_code")',
        "def test_x():\n    assert contest_y() == 1",
    ],
)
def test_the_import_check_leaves_helper_modules_and_mentions(source: str) -> None:
    assert imports_of_test_modules(source + "\n") == [], source
