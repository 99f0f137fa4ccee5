"""Shortcuts for the API and metrics tests: tokens, authenticated requests, row counts."""

from __future__ import annotations

import json
from typing import Any

from django.apps import apps
from django.db import connection
from django.test import Client

from routing.api.tokens import api_token_create
from routing.models import ApiToken

EVENTS_URL = "/api/v1/events"


def make_token(*scopes: str, name: str | None = None) -> tuple[ApiToken, str]:
    scope_list = list(scopes) or ["ingest"]
    return api_token_create(
        name=name or "-".join(["t", *scope_list, str(ApiToken.objects.count())]),
        scopes=scope_list,
    )


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def post_events(
    client: Client,
    token: str,
    body: Any,
    *,
    query: str = "",
    content_type: str = "application/json",
) -> Any:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    url = EVENTS_URL + (f"?{query}" if query else "")
    return client.post(
        url,
        data=data,
        content_type=content_type,
        headers={"Authorization": f"Bearer {token}"},
    )


def row_counts() -> dict[str, int]:
    """Rows in every table of every installed app: 'nothing written' means all equal. One
    query for all of them (the property tests count before and after each of hundreds of
    examples; a query per table was more than half their time on PostgreSQL)."""
    tables = sorted({m._meta.db_table for m in apps.get_models()})
    quote = connection.ops.quote_name
    counts = ", ".join(f"(SELECT COUNT(*) FROM {quote(table)})" for table in tables)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {counts}")
        return dict(zip(tables, cursor.fetchone(), strict=True))
