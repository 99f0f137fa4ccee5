"""What three commands print: `account list` shows every account's
windows, the expired ones said so, and the names outside the registry that have windows;
`health` and `drain` keep their report's lines whole and in order when stdout and stderr
go to one place (a log, a terminal, cron's mail) and stdout is block-buffered, as it is
whenever it is not a terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from domain.windows import Window
from ledger.models import Account
from ledger.windows import windows_record
from routing.drains.inbox import inbox_ingest
from tests.ledger.runner_helpers import child_database_url
from tests.processes import MANAGE_PY, scratch_cwd
from tests.routing.helpers import generic_event
from tests.routing.ops import crowd


def merged(*args: str) -> subprocess.CompletedProcess[str]:
    """`manage.py ARGS` on the test database, stderr into the same pipe as stdout, and
    stdout block-buffered (no PYTHONUNBUFFERED), as under cron or systemd."""
    env = {**os.environ, "DATABASE_URL": child_database_url()}
    env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run(
        [sys.executable, MANAGE_PY, *args],
        cwd=scratch_cwd(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )


@pytest.mark.django_db
def test_account_list_shows_every_accounts_windows_the_expired_ones_said_so() -> None:
    now = timezone.now()
    Account.objects.create(name="acct-a", provider="claude")
    Account.objects.create(name="acct-quiet", provider="codex")
    windows_record(
        account="acct-a",
        provider="claude",
        windows=[
            crowd.expired_429(now),
            Window(name="5h", used=0.42, resets_at=now + timedelta(hours=2)),
        ],
        now=now,
    )
    # A pool member nobody registered (it runs on the worker's own login).
    windows_record(
        account="pool-member",
        provider="codex",
        windows=[Window(name="7d", used=0.8, resets_at=now + timedelta(days=2))],
        now=now,
    )
    out = io.StringIO()
    call_command("account", "list", stdout=out)
    lines = out.getvalue().splitlines()
    a = lines.index(next(line for line in lines if line.startswith("acct-a  ")))
    assert lines[a + 1].startswith("  window 5h: 42% used, resets ")
    assert lines[a + 2].startswith("  window rate_limit: expired, was rejected, reset ")
    quiet = lines.index(next(line for line in lines if line.startswith("acct-quiet ")))
    assert lines[quiet + 1] == "  windows: none reported yet"
    outside = lines.index(
        "not in the registry (they run on the worker's own login), with windows:"
    )
    assert len(lines) == outside + 3 and lines[outside + 1] == "pool-member"
    assert lines[outside + 2].startswith("  window 7d: 80% used, resets ")
    # --json stays the registry's accounts, each with its windows.
    out = io.StringIO()
    call_command("account", "list", "--json", stdout=out)
    assert '"pool-member"' not in out.getvalue()
    assert '"rate_limit"' in out.getvalue()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_health_prints_its_report_then_the_problems_each_on_its_own_line() -> None:
    done = merged("health")
    assert done.returncode == 1, done.stdout
    lines = done.stdout.splitlines()
    cluster = next(i for i, line in enumerate(lines) if "live workers)" in line)
    assert lines[cluster].endswith(" live workers)")
    assert lines[0].startswith("status: ") and lines[1] == "database: ok"
    problems = [i for i, line in enumerate(lines) if line.startswith("problem: ")]
    assert problems and min(problems) > cluster, lines
    assert lines[-1] == "CommandError: unhealthy (see above)"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_drain_ends_with_its_summary_and_leaves_the_queue_log_to_verbosity_2() -> None:
    inbox_ingest(enumerate([generic_event(project="/srv/cmd-out")], start=1))
    done = merged("drain", "generic")
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert lines[-1] == "1 admitted", lines
    assert lines[-2].startswith("drained inbox queue (")
    assert not [line for line in lines if "Enqueued" in line], lines

    inbox_ingest(enumerate([generic_event(project="/srv/cmd-out-2")], start=1))
    loud = merged("drain", "generic", "-v", "2")
    assert loud.returncode == 0, loud.stdout
    assert [line for line in loud.stdout.splitlines() if line.startswith("Enqueued ")]
    assert loud.stdout.splitlines()[-1] == "1 admitted"
