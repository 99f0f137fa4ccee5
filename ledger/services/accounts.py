"""The account registry: add, enable/disable, remove (manage.py account, the admin).

Rules:
1. **Name and provider.** A name is an account profile (domain.pool.valid_profile_name); a
   provider is one of agents.providers.PROVIDERS.
2. **No secret in the environment.** The environment says where the provider CLI keeps the
   login, never a secret: a key that looks like one (`*_KEY`, `*_TOKEN`, `*PASSWORD*`,
   `*SECRET*`) is refused, as are loopsweb's own variables (an agent never sees them) and
   values with NUL or newlines.
3. **Login directories.** A login's directories (`login_environment`): codex `CODEX_HOME`,
   claude `CLAUDE_CONFIG_DIR`, opencode the four XDG directories under one home
   (`XDG_CONFIG_HOME=HOME/config`, `XDG_DATA_HOME=HOME/data`, `XDG_CACHE_HOME=HOME/cache`,
   `XDG_STATE_HOME=HOME/state`): absolute paths, only for the account's provider.
4. **A key in an env file.** An API-key login is an env file (`env_file`): its path is
   stored, never its content; a file that is not 0600 or not owned by the current user is
   refused (agents.envfile).
5. **Bad input writes nothing.** Bad input raises AccountError and writes nothing.
6. **The self-test.** The CLI's self-test and the request it makes (`account check`) run in
   runs.account_check.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from django.db import transaction

from agents.envfile import EnvFileError, read_env_file, reserved_variable
from agents.providers import PROVIDERS
from domain.pool import PROFILE_NAME_INVALID, valid_profile_name
from ledger.models import Account
from ledger.services.common import LedgerError
from ledger.windows import parse_budgets

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
LOGIN_DIR_PROVIDER = "{option} is for {provider} accounts, not {asked}"
LOGIN_DIR_RELATIVE = "{option} must be an absolute path: {path!r}"
# The login directories `account add` takes, per provider: option -> variables.
LOGIN_DIRS: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "codex": {"--codex-home": (("CODEX_HOME", ""),)},
    "claude": {"--claude-config-dir": (("CLAUDE_CONFIG_DIR", ""),)},
    "opencode": {
        "--opencode-home": (
            ("XDG_CONFIG_HOME", "config"),
            ("XDG_DATA_HOME", "data"),
            ("XDG_CACHE_HOME", "cache"),
            ("XDG_STATE_HOME", "state"),
        )
    },
}

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


def login_environment(provider: str, dirs: Mapping[str, str | None]) -> dict[str, str]:
    """The variables of the login directories given as `{option: path}` (module docstring,
    "login directories")."""
    env: dict[str, str] = {}
    for option, path in dirs.items():
        if not path:
            continue
        owner = next((p for p, opts in LOGIN_DIRS.items() if option in opts), None)
        if owner is None or owner != provider:
            raise AccountError(
                LOGIN_DIR_PROVIDER.format(option=option, provider=owner, asked=provider)
            )
        if not os.path.isabs(path) or any(c in path for c in "\x00\r\n"):
            raise AccountError(LOGIN_DIR_RELATIVE.format(option=option, path=path))
        for variable, sub in LOGIN_DIRS[owner][option]:
            env[variable] = os.path.join(os.path.normpath(path), sub) if sub else path
    return env


def account_check(
    *,
    name: str,
    provider: str,
    env: Mapping[str, str],
    max_running: int | None,
    env_file: str | None = None,
) -> dict[str, str]:
    """Validate an account's fields (module docstring: "name and provider", "no secret in the
    environment", "a key in an env file"); returns the checked environment."""
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
    if env_file:
        try:
            read_env_file(env_file)
        except EnvFileError as exc:
            raise AccountError(str(exc)) from None
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
    env_file: str | None = None,
    window_budgets: dict[str, int] | None = None,
    window_pace: bool = False,
) -> Account:
    """Register an account (enabled). An existing name is refused, not overwritten."""
    name = name.strip()
    checked = account_check(
        name=name,
        provider=provider,
        env=env or {},
        max_running=max_running,
        env_file=env_file,
    )
    if Account.objects.filter(pk=name).exists():
        raise AccountError(ACCOUNT_EXISTS.format(name=name))
    row = Account(
        name=name,
        provider=provider,
        env_json=checked,
        env_file=env_file or None,
        max_running=max_running,
        notes=notes,
        window_budgets=window_budgets or None,
        window_pace=window_pace or None,
    )
    row.full_clean()
    if not dry_run:
        row.save(force_insert=True)
    return row


def account_window_budgets(pairs: list[str]) -> dict[str, int]:
    """`--window NAME=TOKENS` values as budgets (ledger.windows); AccountError when bad."""
    try:
        return parse_budgets(pairs)
    except ValueError as exc:
        raise AccountError(str(exc)) from None


def account_edit(
    *,
    name: str,
    window_budgets: dict[str, int] | None = None,
    window_pace: bool | None = None,
    dry_run: bool = False,
) -> Account:
    """Change the account `name`: its window budgets (None: unchanged; {}: none) and
    whether its windows are paced (None: unchanged)."""
    row = Account.objects.filter(pk=name.strip()).first()
    if row is None:
        raise AccountError(ACCOUNT_NOT_FOUND.format(name=name.strip()))
    if window_budgets is not None:
        row.window_budgets = window_budgets or None
    if window_pace is not None:
        row.window_pace = window_pace or None
    if not dry_run:
        row.save(update_fields=["window_budgets", "window_pace", "updated_at"])
    return row


@transaction.atomic
def account_set_enabled(*, name: str, enabled: bool) -> tuple[Account, bool]:
    """Enable or disable an account; returns (row, changed). Enabling also clears a
    `login failed` mark (the operator says the login is good again)."""
    row = Account.objects.select_for_update().filter(pk=name.strip()).first()
    if row is None:
        raise AccountError(ACCOUNT_NOT_FOUND.format(name=name))
    clear = enabled and row.login_failed_at is not None
    if row.enabled == enabled and not clear:
        return row, False
    row.enabled = enabled
    fields = ["enabled", "updated_at"]
    if clear:
        row.login_failed_at = row.login_failed_reason = None
        fields += ["login_failed_at", "login_failed_reason"]
    row.save(update_fields=fields)
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


# -- account check ------------------------------------------------------------------------
