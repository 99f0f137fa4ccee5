"""8 processes route concurrently against route, project, group and per-profile caps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from ledger.selectors import account_load, active_counts
from tests.processes import scratch_cwd
from tests.routing.admission.race_worker import LIMITS, PROJECTS

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _database_url() -> str:
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    user, host, port = (
        settings["USER"],
        settings["HOST"] or "127.0.0.1",
        settings["PORT"] or 5432,
    )
    password = f":{settings['PASSWORD']}" if settings["PASSWORD"] else ""
    return f"postgres://{user}{password}@{host}:{port}/{settings['NAME']}"


def test_eight_concurrent_routers_never_exceed_any_cap() -> None:
    # PYTHONPATH: `-m tests...` imports from the checkout while the cwd is elsewhere.
    env = {**os.environ, "DATABASE_URL": _database_url(), "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.routing.admission.race_worker",
                str(i),
                "25",
                "7",
            ],
            cwd=scratch_cwd(),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    tallies = []
    for proc in workers:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        tallies.append(json.loads(out.strip().splitlines()[-1]))

    violations = [v for t in tallies for v in t["violations"]]
    assert violations == []
    created = sum(t["created"] for t in tallies)
    throttled = sum(t.get("throttled", 0) for t in tallies)
    assert created + throttled == 200
    assert created >= 6 and throttled > 0  # the caps were actually contended
    for project, group in PROJECTS:
        counts = active_counts(scope="race", project_key=project, project_group=group)
        assert (
            counts.scope <= LIMITS["max_active"]
            and counts.project <= LIMITS["max_active_per_project"]
        )
    assert max(account_load().total().values(), default=0) <= LIMITS["max_per_profile"]
