"""A database that refuses writes answers the API with a JSON 503 that says so, and stores
nothing (issue 28 item 2): the producer retries; no event is half-stored or failed."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from tests.routing.api.helpers import make_token, post_events, row_counts
from tests.routing.helpers import generic_event


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_read_only_database_answers_503_and_stores_nothing(client: Client) -> None:
    _, token = make_token("ingest")
    before = row_counts()
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    try:
        response = post_events(client, token, [generic_event(), generic_event()])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE")
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/json"
    assert "refuses writes" in response.json()["error"]
    assert response["Retry-After"]
    assert row_counts() == before
