"""Forged cursors whose time is outside what Python or the database can hold (issue 28, 3).

A cursor is opaque, but a client can build one: its timestamp must be range-checked before
it reaches the WHERE clause, so a forged one is a 400 naming `cursor`, never a 500.
"""

from __future__ import annotations

import base64
import json

import pytest
from django.test import Client

from tests.factories import make_work_item
from tests.routing.api.helpers import bearer, make_token

pytestmark = pytest.mark.django_db


def _cursor(moment: str, row_id: str) -> str:
    raw = json.dumps([moment, row_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("url", ["/api/v1/work-items", "/api/v1/drains"])
@pytest.mark.parametrize(
    "moment",
    [
        "9999-12-31T23:59:59-14:00",  # past datetime.max in UTC (SQLite: OverflowError)
        "0001-01-01T00:00:00+14:00",  # before datetime.min in UTC
        "2026-01-01T00:00:00.999999+23:59",  # PostgreSQL: displacement out of range
        "2026-01-01T00:00:00-23:59",
        "2026-01-01T05:00:00+05:00",  # in range, but not a cursor of ours (always UTC)
        "9999-12-31T23:59:59.999999+00:00",  # the largest time: a valid, empty page
    ],
)
def test_a_forged_cursor_time_is_a_400_naming_the_cursor(
    client: Client, url: str, moment: str
) -> None:
    _, token = make_token("read")
    make_work_item()
    response = client.get(f"{url}?cursor={_cursor(moment, 'z')}", **bearer(token))
    if moment.startswith("9999-12-31T23:59:59.999999+00:00"):
        assert response.status_code == 200, response.content[:300]
        return
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"] == "cursor: invalid cursor"


def test_a_cursor_of_ours_still_pages(client: Client) -> None:
    _, token = make_token("read")
    make_work_item()
    response = client.get(
        f"/api/v1/work-items?cursor={_cursor('2999-01-01T00:00:00+00:00', 'z')}",
        **bearer(token),
    )
    assert response.status_code == 200
    assert len(response.json()["workItems"]) == 1
