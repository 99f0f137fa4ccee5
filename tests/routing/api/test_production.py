"""Production settings pass `manage.py check --deploy` with no warning (issue 8).

Run in a subprocess with a production environment (DEBUG off, a real SECRET_KEY, HTTPS on,
not in test mode), since this process's settings are the test configuration.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def _manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
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
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_passes_with_production_settings(tmp_path: Path) -> None:
    result = _manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_warns_when_https_is_off(tmp_path: Path) -> None:
    # The test above could pass vacuously if --deploy checked nothing: with HTTPS off the
    # same command must fail on the insecure cookie, HSTS and redirect settings.
    result = _manage(
        tmp_path, "check", "--deploy", "--fail-level", "WARNING", LOOPSWEB_HTTPS="0"
    )
    assert result.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in result.stderr + result.stdout, check
