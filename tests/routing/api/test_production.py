"""Production settings pass `manage.py check --deploy` with no warning (issue 8).

Run in a subprocess with a production environment (DEBUG off, a real SECRET_KEY, HTTPS on,
not in test mode), since this process's settings are the test configuration.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from tests.processes import manage

# Their process reads no DATABASE_URL: its own SQLite file, the same in either suite.
pytestmark = [pytest.mark.slow, pytest.mark.own_database]


def _production_env(tmp_path: Path, **env: str) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL"}
        and not k.startswith("LOOPSWEB_")
    }
    base.update(
        {
            "DEBUG": "0",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "LOOPSWEB_HTTPS": "1",
            "ALLOWED_HOSTS": "loops.example.com",
            "LOOPSWEB_DATA_DIR": str(tmp_path),
            "DJANGO_SETTINGS_MODULE": "loopsweb.settings",
        }
    )
    base.update(env)
    return base


def test_check_deploy_passes_with_production_settings(tmp_path: Path) -> None:
    result = manage(
        _production_env(tmp_path),
        *("check", "--deploy", "--fail-level", "WARNING"),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_warns_when_https_is_off(tmp_path: Path) -> None:
    # The test above could pass vacuously if --deploy checked nothing: with HTTPS off the
    # same command must fail on the insecure cookie, HSTS and redirect settings.
    result = manage(
        _production_env(tmp_path, LOOPSWEB_HTTPS="0"),
        *("check", "--deploy", "--fail-level", "WARNING"),
        check=False,
    )
    assert result.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in result.stderr + result.stdout, check
