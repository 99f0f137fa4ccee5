"""Settings come from the environment; bad values stop start-up with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent


def _load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "DEBUG"}
    }
    base.update(
        {
            "LOOPSWEB_TESTING": "0",
            "LOOPSWEB_DATA_DIR": str(tmp_path),
            "SECRET_KEY": "x" * 50,
        }
    )
    base.update(env)
    code = "import django; django.setup(); from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "loopsweb.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SECRET_KEY": ""}, "SECRET_KEY must be set when DEBUG is off"),
        ({"DEBUG": "maybe"}, "DEBUG must be a boolean"),
        (
            {"Q_TIMEOUT": "600", "Q_RETRY": "300"},
            "Q_RETRY (300) must be greater than Q_TIMEOUT (600)",
        ),
        ({"Q_WORKERS": "-1"}, "Q_WORKERS must be >= 1"),
        ({"SQLITE_BUSY_TIMEOUT": "soon"}, "SQLITE_BUSY_TIMEOUT must be an integer"),
        (
            {"DATABASE_URL": "mysql://u@h/db"},
            "DATABASE_URL must be sqlite:// or postgres://",
        ),
        ({"DATABASE_URL": "sqlite://:memory:"}, "must name a SQLite file"),
        (
            {"LOG_LEVEL": "loud"},
            "LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL",
        ),
        (
            {"LOOPSWEB_PROJECT_ROOTS": "/srv/projects,~/code"},
            "LOOPSWEB_PROJECT_ROOTS must list absolute paths, got '~/code'",
        ),
        (
            {"LOOPSWEB_WORKTREE_DIR": "var/worktrees"},
            "LOOPSWEB_WORKTREE_DIR must be an absolute path",
        ),
        (
            {"LOOPSWEB_AGENT_ENV_PASSTHROUGH": "GH_TOKEN,DATABASE_URL"},
            "LOOPSWEB_AGENT_ENV_PASSTHROUGH may not pass loopsweb's own settings",
        ),
        (
            {"LOOPSWEB_AGENT_ENV_PASSTHROUGH": "LOOPSWEB_*"},
            "LOOPSWEB_AGENT_ENV_PASSTHROUGH may not pass loopsweb's own settings",
        ),
        (
            {"LOOPSWEB_AGENT_ENV_PASSTHROUGH": "AWS-KEY"},
            "LOOPSWEB_AGENT_ENV_PASSTHROUGH must list variable names or PREFIX* patterns",
        ),
    ],
)
def test_bad_environment_values_raise_improperly_configured(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = _load_settings(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_sqlite_is_the_default_with_immediate_transactions_wal_and_a_file_test_database(
    tmp_path: Path,
) -> None:
    result = _load_settings(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "django.db.backends.sqlite3"


def test_the_running_configuration_is_utc_with_the_orm_broker_and_no_catch_up() -> None:
    assert settings.TIME_ZONE == "UTC" and settings.USE_TZ
    q = settings.Q_CLUSTER
    assert (
        q["orm"] == "default" and q["catch_up"] is False and q["timeout"] < q["retry"]
    )
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
        assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]
        assert db["TEST"]["NAME"] and db["TEST"]["NAME"] != ":memory:"
