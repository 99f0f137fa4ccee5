"""The account registry: add, enable/disable, remove (manage.py account, the admin).

Rules:
1. A name is an account profile (domain.pool.valid_profile_name); a provider is
   one of ledger.providers.PROVIDERS.
2. The environment says where the provider CLI keeps the login, never a secret: a key
   that looks like one (`*_KEY`, `*_TOKEN`, `*PASSWORD*`, `*SECRET*`) is refused, as are
   loopsweb's own variables (an agent never sees them) and values with NUL or newlines.
3. Bad input raises AccountError and writes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from django.db import transaction

from domain.pool import PROFILE_NAME_INVALID, valid_profile_name
from ledger.models import Account
from ledger.providers import PROVIDERS, reserved_variable
from ledger.services.common import LedgerError

ACCOUNT_EXISTS = "account {name} already exists"
ACCOUNT_NOT_FOUND = "no account named {name!r}"
ACCOUNT_PROVIDER_INVALID = "provider must be one of {providers}: {provider!r}"
ENV_KEY_INVALID = "environment name {key!r} is not a variable name"
ENV_KEY_SECRET = (
    "environment name {key} looks like a secret (*_KEY, *_TOKEN, *PASSWORD*, *SECRET*): "
    "the registry stores where a login lives, never a credential"
)
ENV_KEY_RESERVED = "environment name {key} is loopsweb's own and never reaches an agent"
ENV_VALUE_INVALID = "environment value of {key} contains a NUL byte or a line break"
ENV_PAIR_INVALID = "--env takes KEY=VALUE: {pair!r}"
MAX_RUNNING_INVALID = "max running must be a positive integer"

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_RE = re.compile(r"(_KEY$|_TOKEN$|PASSWORD|SECRET|^KEY$|^TOKEN$)", re.I)


class AccountError(LedgerError):
    """An account registry change that cannot be made as asked."""


def account_env_check(env: Mapping[str, str]) -> dict[str, str]:
    """The environment as stored, or AccountError naming the first bad variable."""
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise AccountError(ENV_KEY_INVALID.format(key=key))
        if _SECRET_RE.search(key):
            raise AccountError(ENV_KEY_SECRET.format(key=key))
        if reserved_variable(key):
            raise AccountError(ENV_KEY_RESERVED.format(key=key))
        if not isinstance(value, str) or any(c in value for c in "\x00\r\n"):
            raise AccountError(ENV_VALUE_INVALID.format(key=key))
        out[key] = value
    return out


def account_env_parse(pairs: list[str]) -> dict[str, str]:
    """`KEY=VALUE` strings (the command's --env) to a checked mapping."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise AccountError(ENV_PAIR_INVALID.format(pair=pair))
        env[key] = value
    return account_env_check(env)


def account_check(
    *, name: str, provider: str, env: Mapping[str, str], max_running: int | None
) -> dict[str, str]:
    """Validate an account's fields (rules 1-2); returns the checked environment."""
    if not valid_profile_name(name):
        raise AccountError(PROFILE_NAME_INVALID.format(name=name))
    if provider not in PROVIDERS:
        raise AccountError(
            ACCOUNT_PROVIDER_INVALID.format(
                providers=", ".join(PROVIDERS), provider=provider
            )
        )
    if max_running is not None and (
        isinstance(max_running, bool)
        or not isinstance(max_running, int)
        or max_running < 1
    ):
        raise AccountError(MAX_RUNNING_INVALID)
    return account_env_check(env)


@transaction.atomic
def account_add(
    *,
    name: str,
    provider: str,
    env: Mapping[str, str] | None = None,
    max_running: int | None = None,
    notes: str = "",
    dry_run: bool = False,
) -> Account:
    """Register an account (enabled). An existing name is refused, not overwritten."""
    name = name.strip()
    checked = account_check(
        name=name, provider=provider, env=env or {}, max_running=max_running
    )
    if Account.objects.filter(pk=name).exists():
        raise AccountError(ACCOUNT_EXISTS.format(name=name))
    row = Account(
        name=name,
        provider=provider,
        env_json=checked,
        max_running=max_running,
        notes=notes,
    )
    row.full_clean()
    if not dry_run:
        row.save(force_insert=True)
    return row


@transaction.atomic
def account_set_enabled(*, name: str, enabled: bool) -> tuple[Account, bool]:
    """Enable or disable an account; returns (row, changed)."""
    row = Account.objects.select_for_update().filter(pk=name.strip()).first()
    if row is None:
        raise AccountError(ACCOUNT_NOT_FOUND.format(name=name))
    if row.enabled == enabled:
        return row, False
    row.enabled = enabled
    row.save(update_fields=["enabled", "updated_at"])
    return row, True


@transaction.atomic
def account_remove(*, name: str, dry_run: bool = False) -> Account:
    """Remove an account from the registry. Step runs keep the name they recorded; the
    name then behaves as an unregistered one."""
    row = Account.objects.filter(pk=name.strip()).first()
    if row is None:
        raise AccountError(ACCOUNT_NOT_FOUND.format(name=name))
    if not dry_run:
        Account.objects.filter(pk=row.pk).delete()
    return row
