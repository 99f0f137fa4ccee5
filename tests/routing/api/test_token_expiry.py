"""API tokens with an expiry and a last-used time (issue 28, 7).

`api_token create --expires 90d` stores when the token stops working; after it, the API
answers a JSON 401 that says the token expired (not "invalid"), the admin shows it, and
`api_token list` too. Tokens without --expires never expire, as before.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from routing.models import ApiToken
from tests.routing.api.helpers import bearer

pytestmark = pytest.mark.django_db


def _create(*args: str) -> str:
    out = io.StringIO()
    call_command("api_token", "create", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_expires_sets_the_expiry_from_now() -> None:
    before = timezone.now()
    _create("ci", "--scope", "read", "--expires", "90d")
    row = ApiToken.objects.get(name="ci")
    assert row.expires_at is not None
    assert before + timedelta(days=90) <= row.expires_at
    assert row.expires_at <= timezone.now() + timedelta(days=90)


@pytest.mark.parametrize(
    ("value", "delta"),
    [
        ("3600s", timedelta(hours=1)),
        ("30m", timedelta(minutes=30)),
        ("12h", timedelta(hours=12)),
    ],
)
def test_expires_takes_seconds_minutes_hours_and_days(
    value: str, delta: timedelta
) -> None:
    before = timezone.now()
    _create("t", "--scope", "read", "--expires", value)
    expires = ApiToken.objects.get(name="t").expires_at
    assert expires is not None and before + delta <= expires <= timezone.now() + delta


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "--expires must be a duration like 90d, 12h, 30m or 3600s"),
        ("0d", "--expires must be a duration like 90d"),
        ("-5d", "--expires must be a duration like 90d"),
        ("99999999999999999999d", "--expires must be at most 3650 days"),
        ("3651d", "--expires must be at most 3650 days"),
    ],
)
def test_a_bad_expiry_is_one_clear_error_and_nothing_is_stored(
    value: str, message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        _create("bad", "--scope", "read", f"--expires={value}")
    assert ApiToken.objects.count() == 0


def test_a_token_is_refused_after_its_expiry_with_a_json_401_that_says_so(
    client: Client,
) -> None:
    token = _create("short", "--scope", "read", "--expires", "1h")
    assert client.get("/api/v1/drains", **bearer(token)).status_code == 200
    row = ApiToken.objects.get(name="short")
    row.expires_at = timezone.now() - timedelta(seconds=1)
    row.save(update_fields=["expires_at"])
    used = row.last_used_at

    response = client.get("/api/v1/drains", **bearer(token))
    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert response["WWW-Authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error.startswith("token expired at ")
    assert error.split()[3].endswith("Z")  # the moment, in UTC
    row.refresh_from_db()
    assert row.last_used_at == used  # a refused token is not "used"


def test_a_token_without_expires_never_expires(client: Client) -> None:
    token = _create("forever", "--scope", "read")
    assert ApiToken.objects.get(name="forever").expires_at is None
    assert client.get("/api/v1/drains", **bearer(token)).status_code == 200


def test_last_used_is_written_on_use_and_at_most_once_a_minute(client: Client) -> None:
    token = _create("busy", "--scope", "read", "--expires", "1d")
    assert ApiToken.objects.get(name="busy").last_used_at is None
    client.get("/api/v1/drains", **bearer(token))
    first = ApiToken.objects.get(name="busy").last_used_at
    assert first is not None
    client.get("/api/v1/drains", **bearer(token))
    assert ApiToken.objects.get(name="busy").last_used_at == first


def test_list_shows_the_expiry_and_the_expired_state() -> None:
    _create("live", "--scope", "read", "--expires", "1d")
    _create("old", "--scope", "read", "--expires", "1d")
    ApiToken.objects.filter(name="old").update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    out = io.StringIO()
    call_command("api_token", "list", "--json", stdout=out)
    entries = {e["name"]: e for e in json.loads(out.getvalue())}
    assert entries["live"]["expiresAt"] and entries["live"]["state"] == "active"
    assert entries["old"]["state"] == "expired"
    out = io.StringIO()
    call_command("api_token", "list", stdout=out)
    line = next(x for x in out.getvalue().splitlines() if x.startswith("old "))
    assert "expired" in line


def test_the_admin_lists_tokens_with_expiry_last_use_and_state(admin_client) -> None:
    token = _create("shown", "--scope", "read", "--expires", "90d")
    _create("gone", "--scope", "read", "--expires", "1d")
    ApiToken.objects.filter(name="gone").update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    page = admin_client.get("/admin/routing/apitoken/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "shown" in html and "gone" in html and "expired" in html
    assert "Expires" in html and "Last used" in html
    assert token not in html  # never the secret, only the prefix
    row = ApiToken.objects.get(name="shown")
    detail = admin_client.get(f"/admin/routing/apitoken/{row.pk}/change/")
    assert detail.status_code == 200 and row.prefix in detail.content.decode()
    assert admin_client.get("/admin/routing/apitoken/add/").status_code == 403
