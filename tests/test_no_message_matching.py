"""Product code decides by type, not by wording (issue 42): rewording a message must change
no behaviour and no count.

The check reads the syntax tree of every product module (domain/, agents/, ledger/, runs/,
routing/, loopsweb/; migrations are frozen history and left out) and fails on:
- a comparison (`==`, `in`, `<`, ...) or a text test (`startswith`, `endswith`, `find`,
  `index`, `count`, `re.match` and the other `re` functions) that reads an exception's
  message: `str(exc)` or `f"{exc}"`, directly or through a name assigned from it in the same
  function (`message = str(exc).lower()` ... `"locked" in message`). An exception is a name an
  `except ... as` binds, a parameter annotated with an exception type, or one named like one
  (`exc`, `err`, `error`, `e`, `ex`);
- an ORM lookup that searches stored message text: a keyword such as `error__contains`,
  `reason__icontains`, `stderr__startswith` (a field named error, reason, message, note,
  stdout or stderr with a text-search lookup). Store a code beside the text instead
  (`WorkflowStepRun.reason_code`);
- a decision on stored reason text: a name or attribute `reason` or `*_reason` compared
  with a message (a string or a `.format(...)` of one) or tested with a text test or
  `removeprefix` (`reason == NO_HOST_HAS.format(project=path)`,
  `run.host_wait_reason.startswith(prefix)`). Placement reads `host_wait_code` instead.

Reading the message to show or store it (`{"error": str(exc)}`, `CommandError(str(exc))`)
is fine: only deciding by it is refused. `ALLOWED` names the places that must read a
message they do not own, each with its reason.
`test_the_checker_catches_what_issue_42_removed` runs the check on the code issue 42
replaced, and on code it must accept. Run over main before issue 42 (867d7ff), the check
named the six places issue 42 replaced (drains' worktree skip, `schedule_drain --every`,
`api_token --expires`, the settings' bound message, the no-host project path, the rate-limit
count of /metrics) besides the driver-message readers `ALLOWED` keeps.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests import source_index

# One worker runs the checks that parse the sources (tests/source_index.py: each file read and
# parsed once per process, not once per worker).
pytestmark = [
    pytest.mark.sqlite,  # reads files only: one suite runs it
    pytest.mark.xdist_group("source_rules"),
]

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("domain", "agents", "ledger", "runs", "routing", "loopsweb")

ALLOWED = {
    # The database driver's errors: SQLite reports busy, read-only, full and damaged
    # databases only in the message (psycopg's SQLSTATE is read first where there is one).
    ("ledger/dberrors.py", "error_passes"),
    ("ledger/dberrors.py", "writes_refused"),
    ("ledger/dberrors.py", "database_damaged"),
    ("loopsweb/dbhealth.py", "corrupt_database_message"),
}

_REASON_TESTS = {
    *{"startswith", "endswith", "find", "rfind", "index", "rindex"},
    "removeprefix",
}


def _stored_reason(node: ast.expr) -> bool:
    """A name or attribute that holds stored reason text: `reason`, `x.host_wait_reason`."""
    name = (
        node.id
        if isinstance(node, ast.Name)
        else node.attr
        if isinstance(node, ast.Attribute)
        else ""
    )
    return name == "reason" or name.endswith("_reason")


def _a_message(node: ast.expr) -> bool:
    """A string constant, or a `.format(...)` of something (a message template)."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value != ""
    ) or (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    )


_EXCEPTION_NAMES = {"exc", "err", "error", "e", "ex", "exception"}
_TEXT_TESTS = {"startswith", "endswith", "find", "rfind", "index", "rindex", "count"}
_RE_FUNCTIONS = {"match", "search", "fullmatch", "findall", "finditer", "sub", "split"}
_LOOKUP = re.compile(
    r"(^|_)(error|reason|message|note|stdout|stderr)s?"
    r"__i?(contains|startswith|endswith|regex)$"
)


def _exception_annotation(node: ast.expr | None) -> bool:
    text = ast.unparse(node) if node is not None else ""
    return bool(re.search(r"(Error|Exception)\b", text))


class _Function(ast.NodeVisitor):
    """The findings of one function body (or of a module's top level)."""

    def __init__(self, exceptions: set[str]) -> None:
        self.exceptions = set(exceptions)
        self.tainted: set[str] = set()
        self.findings: list[int] = []

    def reads_message(self, node: ast.AST) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in self.tainted:
                return True
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id == "str"
                and len(sub.args) == 1
                and self.is_exception(sub.args[0])
            ):
                return True
            if isinstance(sub, ast.FormattedValue) and self.is_exception(sub.value):
                return True
        return False

    def is_exception(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and (
            node.id in self.exceptions or node.id in _EXCEPTION_NAMES
        )

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.exceptions.add(node.name)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if self.reads_message(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.tainted.add(target.id)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        parts = (node.left, *node.comparators)
        if any(self.reads_message(part) for part in parts) or (
            any(_stored_reason(part) for part in parts)
            and any(_a_message(part) for part in parts)
        ):
            self.findings.append(node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr in _TEXT_TESTS and self.reads_message(func.value):
                self.findings.append(node.lineno)
            elif func.attr in _REASON_TESTS and _stored_reason(func.value):
                self.findings.append(node.lineno)
            elif (
                isinstance(func.value, ast.Name)
                and func.value.id == "re"
                and func.attr in _RE_FUNCTIONS
                and any(self.reads_message(arg) for arg in node.args[1:])
            ):
                self.findings.append(node.lineno)
        for keyword in node.keywords:
            if keyword.arg and _LOOKUP.search(keyword.arg):
                self.findings.append(node.lineno)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        pass  # each function is checked on its own (`findings`)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        pass  # likewise


def findings(source: str, path: str) -> list[str]:
    """`path:line (function)` of every decision by message text in `source`."""
    tree = source_index.parsed(source, path)
    scopes: list[tuple[str, list[ast.stmt], set[str]]] = [
        ("<module>", tree.body, set())
    ]
    for node in source_index.nodes(source, path):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            exceptions = {
                arg.arg for arg in arguments if _exception_annotation(arg.annotation)
            }
            scopes.append((node.name, node.body, exceptions))
    found = []
    for name, body, exceptions in scopes:
        if (path, name) in ALLOWED:
            continue
        visitor = _Function(exceptions)
        for statement in body:
            visitor.visit(statement)
        found += [f"{path}:{line} ({name})" for line in visitor.findings]
    return sorted(found)


def _product_files() -> list[Path]:
    files = []
    for package in PRODUCT:
        files += [
            path
            for path in sorted((ROOT / package).rglob("*.py"))
            if "migrations" not in path.relative_to(ROOT).parts
        ]
    return files


def test_no_product_code_decides_by_an_error_message() -> None:
    found = []
    for path in _product_files():
        relative = path.relative_to(ROOT).as_posix()
        found += findings(source_index.text(path), relative)
    assert found == [], "decided by message text (use a typed error or a code):\n" + (
        "\n".join(found)
    )


def test_every_allowed_place_still_exists() -> None:
    defined = set()
    for path, _ in ALLOWED:
        defined |= {
            (path, node.name)
            for node in source_index.nodes(source_index.text(ROOT / path), path)
            if isinstance(node, ast.FunctionDef)
        }
    assert ALLOWED <= defined


_BEFORE = """
def _failed(candidate, exc: Exception, now):
    if str(exc).startswith(WORKTREE_REQUIRED_ERROR):
        return skipped()

def parse_every(text):
    try:
        return bounded_int("--every", text)
    except ValidationError as exc:
        if str(exc).startswith("--every must be at most"):
            raise CommandError("too large") from None

def token_lifetime(text):
    try:
        return bounded_int("--expires", text)
    except ValidationError as problem:
        if "at most" in str(problem):
            raise

def usage(steps):
    return steps.annotate(limited=Count("id", filter=Q(error__contains=MARK)))

def classify(err):
    message = str(err).lower()
    return any(text in message for text in PASSING)

def admit(path):
    try:
        resolve(path)
    except ProjectPathError as failure:
        if re.search("outside", f"{failure}"):
            raise

def held(rows):
    return rows.filter(held_reason__icontains="full").exists()

def decided(path, reason):
    if reason == NO_HOST_HAS.format(project=path):
        return True
    return run.host_wait_reason.startswith("waiting for")
"""

_ACCEPTED = """
def _failed(candidate, exc: Exception, now):
    if isinstance(exc, RouteRefused):
        return {"reason": str(exc)[:640]}
    raise CommandError(str(exc)) from None

def report(exc: Exception):
    message = str(exc)
    logger.warning("failed: %s", message)
    return {"error": f"{type(exc).__name__}: {exc}"}

def usage(steps):
    return steps.filter(reason_code="rate_limited", event_type__startswith="todos.")

def names(rows, status):
    return [row for row in rows if row.status == status]

def waits(run, code):
    return run.host_wait_code == WAIT_MISSING and run.host_wait_reason is not None
"""


def test_the_checker_catches_what_issue_42_removed() -> None:
    lines = [line.split(" ")[0] for line in findings(_BEFORE, "x.py")]
    assert lines == [
        "x.py:10",
        "x.py:17",
        "x.py:21",
        "x.py:25",
        "x.py:3",
        "x.py:31",
        "x.py:35",
        "x.py:38",
        "x.py:40",
    ]
    assert findings(_ACCEPTED, "x.py") == []
