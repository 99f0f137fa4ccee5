"""Settings come from the environment; bad values stop start-up with a clear message."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.processes import manage, scratch_cwd

# Every process here loads the settings with a database of its own (no DATABASE_URL, or one
# the test names), never the suite's.
pytestmark = pytest.mark.own_database

ROOT = Path(__file__).resolve().parent.parent
# A `python -c` child's settings and imports (the project from another cwd).
PROJECT_IMPORTS = {
    "DJANGO_SETTINGS_MODULE": "loopsweb.settings",
    "PYTHONPATH": str(ROOT),
}


def _load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}
        and not k.startswith("LOOPSWEB_")
    }
    base.update(
        {
            "LOOPSWEB_DATA_DIR": str(tmp_path),
            "SECRET_KEY": "x" * 50,
        }
    )
    base.update(env)
    code = "import django; django.setup(); from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=scratch_cwd(),
        env={**base, **PROJECT_IMPORTS},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SECRET_KEY": ""}, "SECRET_KEY must be set when DEBUG is off"),
        (
            {"SECRET_KEY": "", "LOOPSWEB_TESTING": "1"},
            "SECRET_KEY must be set when DEBUG is off",
        ),
        (
            {"LOOPSWEB_LOGIN_LOCKOUT_BY": "cookie"},
            "LOOPSWEB_LOGIN_LOCKOUT_BY must be username+ip, username or ip",
        ),
        (
            {"LOOPSWEB_LOGIN_FAILURE_LIMIT": "0"},
            "LOOPSWEB_LOGIN_FAILURE_LIMIT must be >= 1",
        ),
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
@pytest.mark.slow
def test_bad_environment_values_raise_improperly_configured(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = _load_settings(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


@pytest.mark.slow
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


def _settings_json(tmp_path: Path, prelude: str = "", **env: str) -> dict:
    code = (
        prelude
        + "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({'https': s.SESSION_COOKIE_SECURE, 'hsts': s.SECURE_HSTS_SECONDS, "
        "'redirect': s.SECURE_SSL_REDIRECT, 'hosts': s.ALLOWED_HOSTS, "
        "'axes': [s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME, s.LOOPSWEB_LOGIN_LOCKOUT_RULE]}))"
    )
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}
        and not k.startswith("LOOPSWEB_")
    }
    base.update({"LOOPSWEB_DATA_DIR": str(tmp_path), "SECRET_KEY": "x" * 50, **env})
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=scratch_cwd(),
        env={**base, **PROJECT_IMPORTS},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("prelude", ["", "import pytest; "])
@pytest.mark.slow
def test_test_mode_cannot_weaken_a_production_process(
    tmp_path: Path, prelude: str
) -> None:
    """Issue 17 #8: neither LOOPSWEB_TESTING=1 nor an imported pytest turns off secure
    cookies, HSTS or the HTTPS redirect; only the pytest run itself is the test run."""
    loaded = _settings_json(tmp_path, prelude, LOOPSWEB_TESTING="1")
    assert loaded["https"] is True
    assert loaded["hsts"] == 31536000
    assert loaded["redirect"] is True
    assert loaded["hosts"] == []


@pytest.mark.slow
def test_login_protection_is_configured_from_the_environment(tmp_path: Path) -> None:
    loaded = _settings_json(
        tmp_path,
        LOOPSWEB_LOGIN_FAILURE_LIMIT="9",
        LOOPSWEB_LOGIN_COOLOFF_MINUTES="30",
        LOOPSWEB_LOGIN_LOCKOUT_BY="username",
    )
    assert loaded["axes"] == [9, 0.5, ["username"]]


@pytest.mark.slow
def test_the_data_directory_is_0700_and_the_database_its_wal_and_shm_0600(
    tmp_path: Path,
) -> None:
    """Issue 17 #7: a fresh data directory and an existing, too open one, after migrate and a
    write through the real command (so the WAL and SHM files exist)."""
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    db = data / "loopsweb.sqlite3"
    db.touch()
    os.chmod(db, 0o644)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SQLITE_TEST_NAME"}
        and not k.startswith("LOOPSWEB_")
    }
    env.update(LOOPSWEB_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="loopsweb.settings")
    for args in (
        ["migrate", "--noinput", "-v0"],
        ["api_token", "create", "t1", "--scope", "read"],
    ):
        manage(env, *args)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = sorted(
        p.name for p in data.iterdir() if p.name.startswith("loopsweb.sqlite3")
    )
    assert "loopsweb.sqlite3" in files
    for name in files:
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600, name
    fresh = tmp_path / "fresh" / "nested"
    _settings_json(tmp_path, LOOPSWEB_DATA_DIR=str(fresh))
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert stat.S_IMODE((fresh / "loopsweb.sqlite3").stat().st_mode) == 0o600


@pytest.mark.slow
def test_a_shared_sticky_directory_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    _settings_json(tmp_path, LOOPSWEB_DATA_DIR=str(shared))
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "loopsweb.sqlite3").stat().st_mode) == 0o600


GUNICORN_CONF = Path(__file__).resolve().parent.parent / "loopsweb" / "gunicorn.conf.py"


def _web_config(tmp_path: Path, **env: str) -> dict:
    """What a production web process is configured with: its settings and gunicorn's
    configuration file as gunicorn reads it."""
    code = (
        "import json, os, runpy, stat; import django; django.setup(); "
        "from django.conf import settings as s; "
        f"conf = runpy.run_path({str(GUNICORN_CONF)!r}); "
        "print(json.dumps({'bind': conf['bind'], 'forwarded': conf['forwarded_allow_ips'], "
        "'proxy_header': s.SECURE_PROXY_SSL_HEADER, "
        "'line': conf['limit_request_line'], "
        "'data_mode': stat.S_IMODE(os.stat(s.DATA_DIR).st_mode)}))"
    )
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}
        and not k.startswith("LOOPSWEB_")
    }
    base.update(
        {
            "SECRET_KEY": "x" * 50,
            "ALLOWED_HOSTS": "loopsweb.example",
            "DJANGO_SETTINGS_MODULE": "loopsweb.settings",
            **env,
        }
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=scratch_cwd(),
        env={**base, **PROJECT_IMPORTS},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_web_process_on_postgresql_keeps_its_data_dir_private_and_its_proxy_closed(
    tmp_path: Path,
) -> None:
    """Issue 43 item 6: the data directory is 0700 on PostgreSQL too; LOOPSWEB_PORT sets the
    default bind; forwarded headers are trusted only with LOOPSWEB_BEHIND_PROXY=1, from
    LOOPSWEB_PROXY_IPS; gunicorn lets long request lines through to Django's JSON 414."""
    data = tmp_path / "data"
    plain = _web_config(
        tmp_path,
        LOOPSWEB_DATA_DIR=str(data),
        DATABASE_URL="postgres://loops@127.0.0.1:1/loops",
        LOOPSWEB_PORT="8123",
    )
    assert plain["data_mode"] == 0o700
    assert plain["bind"] == ["127.0.0.1:8123"]
    assert plain["forwarded"] == "" and plain["proxy_header"] is None
    assert plain["line"] == 0
    proxied = _web_config(
        tmp_path,
        LOOPSWEB_DATA_DIR=str(data),
        DATABASE_URL="postgres://loops@127.0.0.1:1/loops",
        LOOPSWEB_BEHIND_PROXY="1",
        LOOPSWEB_PROXY_IPS="10.0.0.7",
        LOOPSWEB_BIND="0.0.0.0:9000",
        LOOPSWEB_PORT="8123",
    )
    assert proxied["bind"] == ["0.0.0.0:9000"]
    assert proxied["forwarded"] == "10.0.0.7"
    assert proxied["proxy_header"] == ["HTTP_X_FORWARDED_PROTO", "https"]
