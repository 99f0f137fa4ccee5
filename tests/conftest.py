"""Test wiring shared by the whole suite.

One suite, two databases: the backend comes from DATABASE_URL (SQLite when unset). Tests that
only make sense on one backend carry `@pytest.mark.postgres` or `@pytest.mark.sqlite` and are
skipped on the other.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

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


@pytest.fixture(autouse=True)
def _backend_markers(request: pytest.FixtureRequest) -> None:
    from django.db import connection

    if (
        request.node.get_closest_marker("postgres")
        and connection.vendor != "postgresql"
    ):
        pytest.skip("PostgreSQL only")
    if request.node.get_closest_marker("sqlite") and connection.vendor != "sqlite":
        pytest.skip("SQLite only")


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


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings) -> None:  # type: ignore[no-untyped-def]
    # Password hashing is not what these tests are about; MD5 keeps user fixtures cheap.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    from django.db import connection

    passed = len(terminalreporter.stats.get("passed", []))
    failed = len(terminalreporter.stats.get("failed", [])) + len(
        terminalreporter.stats.get("error", [])
    )
    skipped = len(terminalreporter.stats.get("skipped", []))
    terminalreporter.write_line(
        f"loopsweb suite on {connection.vendor}: {passed} passed, {failed} failed, {skipped} skipped"
    )
