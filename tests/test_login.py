"""Admin sign-in: brute-force protection (django-axes) and where a login lands (issue 17 #9,
#13)."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def _login(client: Client, password: str, **extra: str):
    return client.post(
        "/admin/login/" + extra.pop("query", ""),
        {"username": "admin", "password": password, **extra},
    )


def test_repeated_wrong_passwords_lock_the_login_out_even_with_the_right_one(
    admin_user, settings
) -> None:
    limit = settings.AXES_FAILURE_LIMIT
    client = Client()
    for _ in range(limit - 1):
        assert (
            _login(client, "wrong").status_code == 200
        )  # the form again, with an error
    assert _login(client, "wrong").status_code == 429
    locked = _login(client, "password")
    assert locked.status_code == 429
    assert "_auth_user_id" not in client.session
    # Another address is not locked out by this one's failures.
    other = Client(REMOTE_ADDR="10.9.8.7")
    assert _login(other, "password").status_code == 302


def test_a_right_password_before_the_limit_signs_in_and_resets_the_count(
    admin_user, settings
) -> None:
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _login(client, "wrong")
    assert _login(client, "password").status_code == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login(client, "wrong").status_code == 200


def test_the_default_limits_come_from_the_environment(settings) -> None:
    assert settings.AXES_ENABLED is True
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME == 0.25  # 15 minutes, in hours
    assert settings.LOOPSWEB_LOGIN_LOCKOUT_RULE == [["username", "ip_address"]]
    assert settings.LOOPSWEB_LOGIN_IP_FAILURE_LIMIT == 30


@pytest.mark.parametrize("next_url", ["https://evil.example/", "//evil.example/x", ""])
def test_a_login_with_an_unsafe_or_empty_next_lands_on_the_admin_index(
    admin_user, next_url: str
) -> None:
    client = Client()
    response = _login(client, "password", next=next_url)
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    assert client.get(response["Location"]).status_code == 200
