"""API tokens: created and revoked by operators, presented by producers and scrapers.

Contract:
1. A token is `lw_` + 43 URL-safe characters (256 random bits). Only its SHA-256 hex digest
   is stored, with the first characters as a recognisable prefix; the token itself is shown
   once, by `api_token_create`, and cannot be recovered.
2. `api_token_authenticate` looks a presented token up by digest and compares the digests
   with `hmac.compare_digest`; revoked tokens and unknown tokens both return None.
3. `last_used_at` is written at most once a minute per token, with a conditional UPDATE, so
   a busy producer does not turn every request into a write.
4. A token may carry an expiry (`expires_at`, from `api_token create --expires 90d`); from
   then on `api_token_authenticate` returns None like for a revoked token (and writes no
   last use), and `api_token_refusal` says which of the two it was.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from domain.bounds import BOUNDS, TooLarge, bounded_int
from domain.errors import ApplicationError, ValidationError
from routing.models import ApiToken

TOKEN_PREFIX = "lw_"
PREFIX_CHARS = (
    11  # "lw_" + 8 characters: enough to tell tokens apart in `api_token list`
)
SCOPES = ("ingest", "read", "metrics")
TOUCH_INTERVAL = timedelta(minutes=1)

TOKEN_NAME_REQUIRED = "token name must not be blank"
TOKEN_NAME_TAKEN = "a token named {name!r} already exists"
TOKEN_SCOPE_REQUIRED = "give at least one scope ({scopes})"
TOKEN_SCOPE_UNKNOWN = "unknown scope {scope!r} (scopes: {scopes})"
TOKEN_NOT_FOUND = "no token named {name!r}"
TOKEN_INVALID = "invalid or revoked token"
TOKEN_EXPIRED = "token expired at {at} (create a new one: manage.py api_token create)"
EXPIRES_INVALID = "--expires must be a duration like 90d, 12h, 30m or 3600s"
EXPIRES_MAX_SECONDS = BOUNDS["--expires"].maximum
EXPIRES_TOO_LARGE = f"--expires must be at most {EXPIRES_MAX_SECONDS // 86400} days"
_LIFETIME = re.compile(r"^([0-9]+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class TokenNotFound(ApplicationError):
    pass


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def token_lifetime(text: str) -> timedelta:
    """`--expires`: `90d`, `12h`, `30m` or `3600s`, within the bounds table's `--expires`."""
    match = _LIFETIME.match(text.strip().lower())
    if not match:
        raise ValidationError(EXPIRES_INVALID)
    unit = _UNIT_SECONDS[match.group(2)]
    try:  # bounded_int: no int() of a 5,000-digit text
        count = bounded_int("--expires", match.group(1), maximum=EXPIRES_MAX_SECONDS)
    except TooLarge:
        raise ValidationError(EXPIRES_TOO_LARGE) from None
    except ValidationError:
        raise ValidationError(EXPIRES_INVALID) from None
    assert count is not None
    if count * unit > EXPIRES_MAX_SECONDS:
        raise ValidationError(EXPIRES_TOO_LARGE)
    return timedelta(seconds=count * unit)


@transaction.atomic
def api_token_create(
    *,
    name: str,
    scopes: list[str],
    expires_in: timedelta | None = None,
    now: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the token text (shown once, never stored).

    `expires_in`: the token stops working that long from now (None: never)."""
    name = name.strip()
    if not name:
        raise ValidationError(TOKEN_NAME_REQUIRED)
    wanted = list(dict.fromkeys(s.strip() for s in scopes if s.strip()))
    if not wanted:
        raise ValidationError(TOKEN_SCOPE_REQUIRED.format(scopes=", ".join(SCOPES)))
    for scope in wanted:
        if scope not in SCOPES:
            raise ValidationError(
                TOKEN_SCOPE_UNKNOWN.format(scope=scope, scopes=", ".join(SCOPES))
            )
    if ApiToken.objects.filter(name=name).exists():
        raise ValidationError(TOKEN_NAME_TAKEN.format(name=name))
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        name=name,
        token_hash=token_digest(token),
        prefix=token[:PREFIX_CHARS],
        scopes=wanted,
        expires_at=(now or timezone.now()) + expires_in if expires_in else None,
    )
    row.full_clean()
    row.save()
    return row, token


@transaction.atomic
def api_token_revoke(*, name: str, now: datetime | None = None) -> ApiToken:
    """Revoke a token by name. Revoking twice keeps the first revocation time."""
    row = ApiToken.objects.filter(name=name.strip()).first()
    if row is None:
        raise TokenNotFound(TOKEN_NOT_FOUND.format(name=name))
    if row.revoked_at is None:
        row.revoked_at = now or timezone.now()
        row.save(update_fields=["revoked_at"])
    return row


def api_token_authenticate(
    token: str, *, now: datetime | None = None
) -> ApiToken | None:
    """The live token row for a presented token, or None (unknown, revoked or expired)."""
    if not token.startswith(TOKEN_PREFIX):
        return None  # not one of ours: no need to hash or query
    digest = token_digest(token)
    row = ApiToken.objects.filter(token_hash=digest).first()
    # The lookup already matched the digest; comparing again in constant time keeps the
    # decision itself free of a data-dependent early exit.
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        return None
    if row.revoked_at is not None:
        return None
    now = now or timezone.now()
    if row.expires_at is not None and row.expires_at <= now:
        return None
    if row.last_used_at is None or row.last_used_at <= now - TOUCH_INTERVAL:
        # Conditional UPDATE: of many concurrent requests, at most one writes per minute.
        ApiToken.objects.filter(pk=row.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - TOUCH_INTERVAL)
        ).update(last_used_at=now)
        row.last_used_at = now
    return row


def token_state(row: ApiToken, now: datetime) -> str:
    """`active`, `expired` or `revoked` (a revoked token stays revoked once it expires)."""
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= now:
        return "expired"
    return "active"


def api_token_refusal(token: str, *, now: datetime | None = None) -> str:
    """Why `api_token_authenticate` refused `token`: expired (with when), or invalid/revoked.

    Only called on the refusal path, so a live token costs no second query."""
    if token.startswith(TOKEN_PREFIX):
        row = (
            ApiToken.objects.filter(token_hash=token_digest(token))
            .only("revoked_at", "expires_at")  # the state is all the refusal needs
            .first()
        )
        now = now or timezone.now()
        if (
            row is not None
            and row.expires_at is not None  # as an expired token's is
            and token_state(row, now) == "expired"
        ):
            at = row.expires_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
            return TOKEN_EXPIRED.format(at=at)
    return TOKEN_INVALID
