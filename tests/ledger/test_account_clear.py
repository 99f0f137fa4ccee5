"""An operator clears what steps' output claimed about an account (ledger.services.account_clear):
its cooldown, its exhausted windows, its `login failed` mark; through `manage.py account
clear` in a second terminal, the admin's action and /ops/accounts/'s button, audited."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from ledger.models import Account, AccountCooldown, AccountWindow
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage, terminal_env

pytestmark = pytest.mark.django_db


def _claimed(name: str = "acct-a") -> None:
    """What a forged output left: a week's cooldown, a window rejected until 9999, a login
    mark; and a window that is fine (which a clear keeps)."""
    now = timezone.now()
    Account.objects.create(
        name=name,
        provider="codex",
        login_failed_at=now,
        login_failed_reason="Not logged in (forged)",
    )
    AccountCooldown.objects.create(
        account_profile=name, until=now + timedelta(days=7), reports=3, reason="forged"
    )
    for window, status, used in (("5h", "rejected", None), ("7d", None, 0.2)):
        AccountWindow.objects.create(
            account_profile=name,
            provider="codex",
            window=window,
            used=used,
            status=status,
            resets_at=now + timedelta(days=3000),
            observed_at=now,
        )


def _state(name: str = "acct-a") -> tuple[bool, list[str], bool]:
    now = timezone.now()
    cooling = AccountCooldown.objects.filter(
        account_profile=name, until__gt=now
    ).exists()
    windows = sorted(
        AccountWindow.objects.filter(account_profile=name).values_list(
            "window", flat=True
        )
    )
    login = Account.objects.get(pk=name).login_failed_at is not None
    return cooling, windows, login


def _clear(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("account", "clear", *args, "--json", stdout=out)
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def test_a_dry_run_says_what_would_go_and_changes_nothing() -> None:
    _claimed()
    found = _clear("acct-a", "--dry-run")
    assert found["result"] == "would clear"
    assert found["windows"] == ["5h"] and found["loginFailed"] is True
    assert found["cooldownUntil"] is not None
    assert _state() == (True, ["5h", "7d"], True)


def test_one_part_at_a_time_then_all_of_it() -> None:
    _claimed()
    assert _clear("acct-a", "--cooldown")["result"] == "cleared"
    assert _state() == (False, ["5h", "7d"], True)
    assert _clear("acct-a")["windows"] == ["5h"]
    assert _state() == (False, ["7d"], False)
    assert _clear("acct-a")["result"] == "nothing to clear"


def test_an_unknown_account_is_refused() -> None:
    with pytest.raises(CommandError, match="no account named 'nope'"):
        _clear("nope")


def test_the_ops_button_and_the_admin_action_clear_and_audit(admin_client: Any) -> None:
    _claimed("acct-a")
    _claimed("acct-b")
    page = admin_client.get("/ops/accounts/").content.decode()
    assert 'action="/ops/accounts/acct-a/clear/"' in page
    answer = admin_client.post("/ops/accounts/acct-a/clear/")
    assert answer.status_code == 302
    assert _state("acct-a") == (False, ["7d"], False)
    entry = LogEntry.objects.get(object_id="acct-a")
    assert entry.change_message.startswith(
        "Clear the account (ops): the cooldown until"
    )
    assert admin_client.get("/ops/accounts/acct-a/clear/").status_code == 405
    admin_client.post(
        "/admin/ledger/account/",
        {"action": "clear_accounts", "_selected_action": ["acct-b"]},
    )
    assert _state("acct-b") == (False, ["7d"], False)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_second_terminal_clears_the_account(tmp_path: Any) -> None:
    _claimed()
    env = terminal_env(
        tmp_path, SECRET_KEY=settings.SECRET_KEY, DATABASE_URL=child_database_url()
    )
    done = manage(env, "account", "clear", "acct-a")
    assert "account: cleared acct-a: the cooldown until" in done.stdout
    assert "exhausted windows 5h" in done.stdout and "login failed mark" in done.stdout
    assert _state() == (False, ["7d"], False)
    bad = manage(env, "account", "clear", "nobody", check=False)
    assert bad.returncode != 0 and "no account named 'nobody'" in bad.stderr
