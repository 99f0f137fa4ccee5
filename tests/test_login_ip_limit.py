"""A second lock-out rule: failures from one address across usernames (issue 28, 7).

The username+address rule alone lets one address try every username a few times each. Now
LOOPSWEB_LOGIN_IP_FAILURE_LIMIT failed logins from one address, whatever the usernames,
lock that address out (429, even with a right password), while the per-username limit
(LOOPSWEB_LOGIN_FAILURE_LIMIT) stays what it was.
"""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def _login(client: Client, username: str, password: str):
    return client.post("/admin/login/", {"username": username, "password": password})


def test_failures_across_usernames_lock_the_address_out(admin_user, settings) -> None:
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.LOOPSWEB_LOGIN_IP_FAILURE_LIMIT == 30
    settings.LOOPSWEB_LOGIN_IP_FAILURE_LIMIT = 12
    client = Client(REMOTE_ADDR="10.1.1.1")
    # Four usernames, three failures each: no username reaches its limit of 5.
    statuses = [
        _login(client, f"guess-{n}", "wrong").status_code
        for n in range(4)
        for _ in range(3)
    ]
    assert statuses[:11] == [200] * 11
    assert statuses[11] == 429  # the twelfth failure from this address
    # The address is locked for every username, the right password included.
    assert _login(client, "admin", "password").status_code == 429
    assert "_auth_user_id" not in client.session
    # Another address is not.
    assert (
        _login(Client(REMOTE_ADDR="10.2.2.2"), "admin", "password").status_code == 302
    )


def test_below_the_address_limit_the_per_username_rule_still_applies(
    admin_user, settings
) -> None:
    client = Client(REMOTE_ADDR="10.3.3.3")
    for _ in range(4):
        assert _login(client, "admin", "wrong").status_code == 200
    assert _login(client, "admin", "wrong").status_code == 429  # 5 for one username
    # Same address, another username: not locked (5 failures < the address limit).
    assert _login(client, "someone-else", "wrong").status_code == 200


def test_a_success_does_not_reset_the_address_count(admin_user, settings) -> None:
    settings.LOOPSWEB_LOGIN_IP_FAILURE_LIMIT = 6
    client = Client(REMOTE_ADDR="10.4.4.4")
    for n in range(5):
        assert _login(client, f"guess-{n}", "wrong").status_code == 200
    assert _login(client, "admin", "password").status_code == 302  # resets admin only
    client.logout()
    assert _login(client, "guess-9", "wrong").status_code == 429  # the sixth failure
