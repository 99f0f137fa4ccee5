"""Test wiring shared by the whole suite.

One suite, two databases: the backend comes from DATABASE_URL (SQLite when unset). Tests that
only make sense on one backend carry `@pytest.mark.postgres` or `@pytest.mark.sqlite` and are
skipped on the other. A test whose processes use a database of their own (a settings check
with no DATABASE_URL, a throwaway SQLite file), never the suite's, carries
`@pytest.mark.own_database`: it runs in the SQLite suite only, as the PostgreSQL suite would
run the very same thing.

`make test` runs the suite on pytest-xdist workers. Each worker has its own test database:
pytest-django suffixes the test database's name with the worker id (SQLite
`<SQLITE_TEST_NAME>_gw0`, PostgreSQL `test_<name>_gw0`), and the processes a test starts get
that database through `tests.ledger.runner_helpers.child_database_url()`.

A test that starts a process or sleeps must carry `@pytest.mark.slow` (`make test-fast` leaves
those out): an unmarked test that does fails at teardown, naming what it started. Tests that
take over about a second of CPU (property tests, migration round trips) carry it too.
"""

from __future__ import annotations

import fcntl
import gc
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import is_hypothesis_test

# Processes the suite spawns (runserver, qcluster, management commands) are not the test run
# itself, so loopsweb.settings gives them production defaults. They inherit these explicit
# settings instead: a throwaway key, plain HTTP on loopback. Nothing here can leak into a
# process outside the suite.
CHILD_TEST_ENV = {
    "SECRET_KEY": "test-only-" + secrets.token_urlsafe(40),
    "LOOPSWEB_HTTPS": "0",
    "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
    # pages name static files as they are (no collectstatic manifest to read)
    "LOOPSWEB_STATIC_MANIFEST": "0",
}
for _name, _value in CHILD_TEST_ENV.items():
    os.environ.setdefault(_name, _value)

# Fake project paths in tests (never created) live under this root; real ones (git repos,
# directories an agent works in) under pytest's temporary directory, the other root.
FAKE_PROJECTS = "/srv"


def pytest_report_header(config: pytest.Config) -> str:
    from django.db import connection

    return f"loopsweb database backend: {connection.vendor} ({connection.settings_dict['NAME']})"


def _skip_on_the_other_backend(item: pytest.Item) -> None:
    """The backend marks, read in pytest_runtest_setup before any fixture: a test skipped on
    this backend sets up nothing (a module's migrated file, a cluster, the CLIs' install)."""
    from django.db import connection

    if item.get_closest_marker("postgres") and connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    if item.get_closest_marker("sqlite") and connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    if item.get_closest_marker("own_database") and connection.vendor != "sqlite":
        pytest.skip(
            "its processes use a database of their own: run in the SQLite suite"
        )


@pytest.fixture(scope="session", autouse=True)
def _project_roots(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The isolation settings every test runs with, for this process and its children.

    Routes need a project root (LOOPSWEB_PROJECT_ROOTS); the fake agent reads FAKE_AGENT_*
    variables, which the agent environment allowlist passes only when named. Set in the
    environment too, so `manage.py` subprocesses (runner, qcluster, runserver) agree.
    """
    from django.conf import settings

    base = os.path.realpath(tmp_path_factory.getbasetemp())
    values = {
        "LOOPSWEB_PROJECT_ROOTS": (base, FAKE_PROJECTS),
        "LOOPSWEB_AGENT_ENV_PASSTHROUGH": ("FAKE_AGENT_*",),
        "LOOPSWEB_WORKTREE_DIR": str(Path(base) / "worktrees"),
    }
    for name, value in values.items():
        os.environ[name] = value if isinstance(value, str) else ",".join(value)
        setattr(settings, name, value)


def sqlite_test_template() -> Path | None:
    """LOOPSWEB_TEST_DB_TEMPLATE in the SQLite suite: a migrated SQLite file."""
    from django.db import connection

    template = os.environ.get("LOOPSWEB_TEST_DB_TEMPLATE")
    return Path(template) if template and connection.vendor == "sqlite" else None


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None,
) -> bool:
    """Each worker's test database starts as a copy of a migrated one when scripts/test.sh
    names it (LOOPSWEB_TEST_DB_TEMPLATE: the database check_migrations read, just migrated),
    so `migrate` finds nothing to apply instead of running every migration again in every
    worker (about 1.5 s of CPU each). PostgreSQL copies it itself (the TEMPLATE of its
    CREATE DATABASE); a SQLite file is copied here, and kept rather than created (keepdb).
    Returns whether a SQLite copy was made. Runs after pytest-django named the worker's
    database (the parallel suffix)."""
    from django.conf import settings
    from django.db import connection

    test = settings.DATABASES["default"].setdefault("TEST", {})
    if connection.vendor == "postgresql":
        if os.environ.get("LOOPSWEB_TEST_DB_TEMPLATE"):
            test["TEMPLATE"] = os.environ["LOOPSWEB_TEST_DB_TEMPLATE"]
        return False
    template = sqlite_test_template()
    name = test.get("NAME")
    if template is None or not name or "memory" in str(name):
        return False  # an in-memory database (":memory:", "mode=memory") is not a file
    # A -wal file beside it holds writes a copy of the file alone would miss.
    if template.with_name(template.name + "-wal").exists():
        raise pytest.UsageError(
            f"LOOPSWEB_TEST_DB_TEMPLATE {template} has a -wal file: a process still has it open"
        )
    for leftover in (name + "-wal", name + "-shm"):  # never replayed over the new copy
        Path(leftover).unlink(missing_ok=True)
    shutil.copyfile(template, name)
    os.chmod(name, 0o600)
    return True


@pytest.fixture(scope="session")
def django_db_keepdb(
    request: pytest.FixtureRequest, django_db_modify_db_settings: bool
) -> bool:
    """pytest-django's (--reuse-db), or a SQLite test database copied from the template."""
    return bool(request.config.getvalue("reuse_db")) or django_db_modify_db_settings


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """`migrated_sqlite(db)` puts a migrated SQLite file at `db` (0600, its directory 0700),
    for tests whose processes use a file of their own but whose subject is not migrating it.
    The file is a copy of one `manage.py migrate`d file that a suite's workers share (in the
    run's base temporary directory, migrated by the first that asks): a migration from
    nothing is more than a second of CPU, once per run instead of once per test."""
    from tests.processes import manage, own_sqlite_env

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    template = root / "migrated-template" / "loopsweb.sqlite3"
    given = sqlite_test_template()
    if given is not None:  # the SQLite suite's: migrated already (scripts/test.sh)
        template = given
    with open(root / "migrated-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            data = tmp_path_factory.mktemp("migrating") / "data"
            manage(own_sqlite_env(data), "migrate", "--noinput", "-v0", timeout=300)
            made = data / template.name
            assert not made.with_name(made.name + "-wal").exists()  # all in the file
            template.parent.mkdir(exist_ok=True)
            os.replace(made, template)

    def copy(db: Path) -> Path:
        db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(template, db)
        db.chmod(0o600)
        return db

    return copy


@pytest.fixture(autouse=True)
def _hosts_read_anew() -> None:
    # ledger.hosts keeps the registered hosts for two seconds per process; a test starts
    # with what its own database holds.
    from ledger.hosts import hosts_read_forget

    hosts_read_forget()


@pytest.fixture(autouse=True)
def _lock_idle_limit_outlasts_the_test_transaction(
    request: pytest.FixtureRequest,
) -> None:
    """A test without `transaction=True` runs inside one transaction: the admission lock's
    `SET LOCAL idle_in_transaction_session_timeout` then lasts for the whole test, and an
    in-process run quiet for 10 s (an agent step) would have its session ended by the server.
    In such tests the limit is the bound (600 s); tests of the limit set their own, and the
    processes a test starts get the product's default."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None or marker.kwargs.get("transaction"):
        return
    request.getfixturevalue("settings").LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS = 600


@pytest.fixture(autouse=True)
def _agent_sandbox(request: pytest.FixtureRequest, monkeypatch, settings) -> None:
    """Which tests run their agents in the product's default sandbox (bwrap, runs.sandbox):
    the real CLIs (tests/agents/) and the tests marked `sandboxed` (the isolation's own, the
    hostile agents). The fake agent's logic tests run with LOOPSWEB_AGENT_SANDBOX=off: their
    agent writes its records, barriers and probes into the test's own directories, which a
    sandbox holds none of. Set in the environment too, for the processes a test starts."""
    node = request.node
    on = node.get_closest_marker("sandboxed") is not None or (
        Path(str(node.fspath)).parent.name == "agents"
    )
    mode = "bwrap" if on else "off"
    monkeypatch.setenv("LOOPSWEB_AGENT_SANDBOX", mode)
    settings.LOOPSWEB_AGENT_SANDBOX = mode


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings) -> None:
    # Password hashing is not what these tests are about; MD5 keeps user fixtures cheap.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --- `slow`: every test that starts a process or waits on a timer ---------------------------------

# Audit events (PEP 578) of starting a process.
_PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.exec",
    }
)
# What the running test (not marked slow) started or slept; None while no such test runs.
_unmarked_waits: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    seen = _unmarked_waits
    if seen is not None and event in _PROCESS_EVENTS:
        what = args[1] if event == "subprocess.Popen" else args[:1]
        seen.append(f"{event} {str(what)[:120]}")


sys.addaudithook(_audit)
# Python 3.11 has no audit event for time.sleep: the suite's processes see it through this
# wrapper (same behaviour; sleeps of the test's own thread are noted).
_sleep = time.sleep


def _noted_sleep(seconds: float) -> None:
    seen = _unmarked_waits
    if (
        seen is not None
        and seconds > 0
        and threading.current_thread() is threading.main_thread()
    ):
        seen.append(f"time.sleep({seconds})")
    _sleep(seconds)


time.sleep = _noted_sleep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    global _unmarked_waits
    _skip_on_the_other_backend(item)
    if item.get_closest_marker("slow") is None:
        _unmarked_waits = []
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, Any]:
    global _unmarked_waits
    try:
        result = yield
    finally:
        seen, _unmarked_waits = _unmarked_waits, None
    if seen:
        listed = "; ".join(dict.fromkeys(seen))
        pytest.fail(
            f"{item.nodeid} starts a process or sleeps but is not marked slow: give it "
            f"@pytest.mark.slow (it ran {listed})",
            pytrace=False,
        )
    return result


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    """On xdist workers: the `xdist_group`s first (in GROUP_ORDER), then the other slow tests,
    then the rest (its property tests first), so the long ones start early instead of ending
    the run on one busy worker while the others idle. Every worker sorts its identical
    collection the same way, and scripts/test.sh passes `--no-loadscope-reorder`, so xdist
    hands the work out in this order: one group to each worker first, the single tests
    after."""
    _run_once(config, items)
    keys = {item.nodeid: _schedule_key(item) for item in items}  # every group is listed
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(
            key=lambda item: keys[item.nodeid]
        )  # stable: collection order per rank


# The fixtures through which a test reaches the database (pytest-django's; django_db_blocker
# is not one of them: every test has it, through pytest-django's autouse fixtures).
_DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_setup", "live_server"}
)


def _run_once(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that starts no process (not `slow`: the audit hook holds it to that) and has no
    database (pytest-django refuses it one) runs the same code whichever database the suite
    has: it runs in the SQLite suite only, and the PostgreSQL suite deselects it (about 700
    tests, parsing, layering, docs and domain rules; their CPU is better spent elsewhere on the
    2-core machine). A test may still claim PostgreSQL with the `postgres` mark."""
    from django.db import connection

    if connection.vendor == "sqlite":
        return
    kept: list[pytest.Item] = []
    once: list[pytest.Item] = []
    for item in items:
        needs_nothing = (
            item.get_closest_marker("django_db") is None
            and item.get_closest_marker("slow") is None
            and item.get_closest_marker("postgres") is None
            and not _DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        )
        (once if needs_nothing else kept).append(item)
    if once:
        config.hook.pytest_deselected(items=once)
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """What is loaded by now (Django, the apps, every test module) lives as long as the run:
    frozen, no garbage collection during the tests scans it again (loopsweb/startup.py does
    the same for the processes the tests start)."""
    gc.collect()
    gc.freeze()


# The xdist groups, longest first as measured on the 2-core machine (a group whose worker
# picks it up last ends the run): the hosts' and the instances' minutes of lease and
# heartbeat waits (PostgreSQL only), the whole installations, the real CLIs through the
# runner and the others, the capacity run, the browser tests (one Chromium), the upgrade
# copies; last, the rule tests that parse the sources, on one worker so that it alone reads
# and parses them (tests/source_index.py), a few seconds.
GROUP_ORDER = (
    "hosts",
    "instances",
    "installation",
    "agent_clis_runner",
    "agent_clis_login",
    "agent_clis",
    "installation_capacity",
    "browser",
    "upgrade",
    "source_rules",
)


def _schedule_key(item: pytest.Item) -> tuple[int, bool, bool]:
    group = item.get_closest_marker("xdist_group")
    if group is None:
        # Among the rest, the property tests first: a few seconds each (a hundred examples),
        # they would otherwise come last and end the run on one worker while the others idle.
        return (
            len(GROUP_ORDER),
            item.get_closest_marker("slow") is None,
            not is_hypothesis_test(getattr(item, "obj", None)),
        )
    name = group.args[0]
    if name not in GROUP_ORDER:
        raise pytest.UsageError(
            f"{item.nodeid}: xdist_group {name!r} is not in tests/conftest.py GROUP_ORDER"
        )
    return GROUP_ORDER.index(name), False, False


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    from django.db import connection

    passed = len(terminalreporter.stats.get("passed", []))
    failed = len(terminalreporter.stats.get("failed", [])) + len(
        terminalreporter.stats.get("error", [])
    )
    skipped = len(terminalreporter.stats.get("skipped", []))
    terminalreporter.write_line(
        f"loopsweb suite on {connection.vendor}: {passed} passed, {failed} failed, {skipped} skipped"
    )


# --- the checkout stays as it was -------------------------------------------------------------

_CHECKOUT = Path(__file__).resolve().parent.parent
# `git status --porcelain` of the checkout at session start (None: not a git checkout).
_STATUS_AT_START = pytest.StashKey[set[str] | None]()


def _checkout_status() -> set[str] | None:
    """The paths `git status --porcelain` lists (every untracked file by name); None when
    the checkout is not a git work tree or git cannot say."""
    try:
        done = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all", "-z"],
            cwd=_CHECKOUT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    paths: set[str] = set()
    entries = iter(done.stdout.split("\0"))
    for entry in entries:
        if not entry:
            continue
        paths.add(entry[3:])
        if entry[0] in "RC":  # a rename or copy: its source path follows
            next(entries, None)
    return paths


def _controls_the_session(config: pytest.Config) -> bool:
    """The xdist controller, or the one process of a run without xdist (not a worker)."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controls_the_session(session.config):
        session.config.stash[_STATUS_AT_START] = _checkout_status()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a file shows in `git status` that did not at its start: a test
    (or a process it started) wrote into the checkout."""
    if not _controls_the_session(session.config):
        return
    before = session.config.stash.get(_STATUS_AT_START, None)
    if before is None:
        return  # not a git checkout: nothing to compare
    after = _checkout_status()
    if after is None:
        return
    new = sorted(after - before)
    if not new:
        return
    message = (
        "the test run changed the checkout: these files show in `git status` and did not "
        "at its start (a test or a process it started wrote there; start it in a temporary "
        f"directory): {', '.join(new)}"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(message, red=True, bold=True)
    else:
        print(message, file=sys.stderr)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
