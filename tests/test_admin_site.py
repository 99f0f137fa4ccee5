"""The admin's ModelAdmins load with the pages and with the admin's system check, not at
start-up (loopsweb/admin_site.py): a process that only sets Django up registers none, and
`manage.py check` still checks every one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import own_sqlite_env, scratch_cwd

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, django
django.setup()
from django.contrib import admin
from django.core import checks
at_setup = len(admin.site._registry)
checks.run_checks(tags=[checks.Tags.admin])
models = sorted(m._meta.label for m in admin.site._registry)
print(json.dumps({"at_setup": at_setup, "checked": models}))
"""


@pytest.mark.slow
@pytest.mark.own_database
def test_setup_registers_no_admin_and_the_admin_check_discovers_every_one(
    tmp_path: Path,
) -> None:
    env = own_sqlite_env(tmp_path, PYTHONPATH=str(ROOT), SECRET_KEY="x" * 50)
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=scratch_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["at_setup"] == 0
    assert {"ledger.WorkflowRun", "ledger.Account", "routing.ApiToken"} <= set(
        seen["checked"]
    ), seen["checked"]
