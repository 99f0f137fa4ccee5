"""`manage.py api_token create|list|revoke`: shown once, stored as a hash, revocable."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from routing.api.tokens import api_token_authenticate
from routing.models import ApiToken
from tests.routing.api.helpers import bearer

pytestmark = pytest.mark.django_db


def _run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("api_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_create_prints_the_token_once_and_stores_only_its_hash() -> None:
    out, err = _run("create", "ci", "--scope", "ingest", "--scope", "read")
    token = out.strip()
    assert token.startswith("lw_") and len(token) >= 40
    assert "shown once" in err and token not in err
    row = ApiToken.objects.get(name="ci")
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert row.prefix == token[:11] and row.scopes == ["ingest", "read"]
    # The secret appears in no column.
    assert all(token not in str(getattr(row, f.attname)) for f in row._meta.fields)
    assert api_token_authenticate(token) == row

    listed, _ = _run("list")
    assert "ci" in listed and row.prefix in listed and token not in listed


def test_two_creates_give_different_tokens_and_names_are_unique() -> None:
    first = _run("create", "a", "--scope", "read")[0].strip()
    second = _run("create", "b", "--scope", "read")[0].strip()
    assert first != second
    with pytest.raises(CommandError, match="a token named 'a' already exists"):
        _run("create", "a", "--scope", "read")
    assert ApiToken.objects.count() == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "x"], "give at least one scope"),
        (["create", "x", "--scope", "admin"], "invalid choice: 'admin'"),
        (["create", " ", "--scope", "read"], "token name must not be blank"),
        (["revoke", "nobody"], "no token named 'nobody'"),
    ],
)
def test_bad_arguments_are_one_clear_error(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        _run(*args)
    assert ApiToken.objects.count() == 0


def test_list_json_shows_usage_and_revocation(client: Client) -> None:
    token = _run("create", "scraper", "--scope", "metrics")[0].strip()
    _run("create", "old", "--scope", "read")
    client.get("/metrics", **bearer(token))

    dry, _ = _run("revoke", "old", "--dry-run")
    assert "would revoke old" in dry
    assert ApiToken.objects.get(name="old").revoked_at is None
    out, _ = _run("revoke", "old")
    assert out.startswith("api_token: revoked old")
    again, _ = _run("revoke", "old")
    assert again.startswith("api_token: already revoked old")

    entries = {e["name"]: e for e in json.loads(_run("list", "--json")[0])}
    assert entries["scraper"]["lastUsedAt"] is not None
    assert entries["scraper"]["revokedAt"] is None
    assert (
        entries["old"]["revokedAt"] is not None and entries["old"]["lastUsedAt"] is None
    )
    assert set(entries["scraper"]) == {
        "name",
        "prefix",
        "scopes",
        "createdAt",
        "lastUsedAt",
        "revokedAt",
        "expiresAt",
        "state",
    }


def test_tokens_of_other_shapes_are_refused_without_a_query(
    django_assert_num_queries,
) -> None:
    with django_assert_num_queries(0):
        assert api_token_authenticate("not-ours") is None
