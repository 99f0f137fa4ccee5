"""`manage.py account add/edit --window` and `account list` with windows, as child processes on
the test database (committed rows: `transaction=True`)."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
from django.utils import timezone

from domain.windows import Window
from ledger.models import Account
from ledger.windows import windows_record
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _env() -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": child_database_url()}


def test_window_budgets_are_set_edited_refused_and_listed() -> None:
    env = _env()
    manage(
        env, "account", "add", "acctA", "--provider", "codex", "--window", "5h=2000000"
    )
    assert Account.objects.get(pk="acctA").window_budgets == {"5h": 2000000}
    manage(
        env, "account", "edit", "acctA", "--window", "5h=1000", "--window", "7d=9000"
    )
    assert Account.objects.get(pk="acctA").window_budgets == {"5h": 1000, "7d": 9000}

    bad = manage(env, "account", "edit", "acctA", "--window", "5h=lots", check=False)
    assert bad.returncode != 0 and "--window must be WINDOW=TOKENS" in bad.stderr
    refused = manage(
        env,
        "account",
        "add",
        "acctB",
        "--provider",
        "codex",
        "--window",
        "x",
        check=False,
    )
    assert refused.returncode != 0
    assert not Account.objects.filter(pk="acctB").exists()
    assert Account.objects.get(pk="acctA").window_budgets == {"5h": 1000, "7d": 9000}

    windows_record(
        account="acctA",
        provider="codex",
        windows=[
            Window(
                name="5h",
                used=0.42,
                resets_at=timezone.now() + timedelta(hours=2),
                source="codex rollout\x1b]52;c;evil\x07",
            )
        ],
    )
    listed = manage(env, "account", "list").stdout
    assert "window budgets: 5h=1000 7d=9000" in listed
    assert "window 5h: 42% used" in listed
    assert "\x1b" not in listed and "\\x1b]52" in listed  # shown, never obeyed
    # 7d: no observation, so loopsweb's estimate (no step ran: 0 tokens)
    assert "window 7d: 0% used" in listed and "loopsweb estimate" in listed
    entries = json.loads(manage(env, "account", "list", "--json").stdout)
    (entry,) = entries
    assert {w["window"]: w["used"] for w in entry["windows"]} == {"5h": 0.42, "7d": 0.0}

    manage(env, "account", "edit", "acctA", "--window-pace")
    row = Account.objects.get(pk="acctA")
    assert row.window_pace and row.window_budgets == {"5h": 1000, "7d": 9000}
    assert "window pace: on" in manage(env, "account", "list").stdout
    both = manage(
        env,
        "account",
        "edit",
        "acctA",
        "--window-pace",
        "--no-window-pace",
        check=False,
    )
    assert both.returncode != 0
    nothing = manage(env, "account", "edit", "acctA", check=False)
    assert nothing.returncode != 0 and "give --window" in nothing.stderr
    manage(env, "account", "edit", "acctA", "--no-windows", "--no-window-pace")
    row = Account.objects.get(pk="acctA")
    assert row.window_budgets is None and not row.window_pace
