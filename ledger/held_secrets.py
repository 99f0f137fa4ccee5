"""What loopsweb holds that an agent must never reach (docs/isolation.md §7): the paths no
sandbox binds, the files hidden even inside a bound directory, and the secret VALUES
(`held_secrets`): every account's env-file values, the tokens of the accounts' login files,
the GitHub token, SECRET_KEY and the database password. Those values are redacted from every
step's stored output, errors and events (agents.redaction), and a run whose work holds one is
not committed (runs.worktrees)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

from agents.envfile import EnvFileError, read_env_file
from agents.redaction import MIN_LENGTH, looks_secret


def protected_paths() -> list[tuple[str, str]]:
    """(path, what it is) that no operator bind may expose."""
    from ledger.selectors import account_env_files, account_homes

    found: list[tuple[str, str]] = [
        (str(settings.DATA_DIR), "loopsweb's data directory"),
        (str(settings.BASE_DIR), "loopsweb's checkout"),
        (sys.prefix, "loopsweb's virtual environment"),
        ("/etc/loopsweb", "loopsweb's configuration"),
        (str(settings.LOOPSWEB_WORKTREE_DIR), "the runs' worktrees"),
    ]
    token = getattr(settings, "LOOPSWEB_GITHUB_TOKEN_FILE", None)
    if token:
        found.append((str(token), "the GitHub token file"))
    hook = getattr(settings, "LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE", None)
    if hook:
        found.append((str(hook), "the GitHub webhook secret file"))
    for path in account_env_files():
        found.append((path, "an account's env file"))
    for name, homes in account_homes().items():
        found.extend((path, f"the login of account {name}") for path in homes)
    return [(os.path.realpath(path), what) for path, what in found]


def secret_files(own_homes: Iterable[str] = ()) -> list[str]:
    """Files hidden even inside a bound directory (module docstring), and the login
    directories of every account whose homes are not `own_homes`."""
    from ledger.selectors import account_env_files, account_homes

    data = Path(settings.DATA_DIR)
    found = [str(data / "secret_key"), str(data / "loopsweb.env")]
    database = settings.DATABASES["default"]
    if "sqlite" in database["ENGINE"]:
        found.append(str(database["NAME"]))
    for setting in (
        "LOOPSWEB_GITHUB_TOKEN_FILE",
        "LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE",
    ):
        if held := getattr(settings, setting, None):
            found.append(str(held))
    found.extend(account_env_files())
    own = {os.path.realpath(path) for path in own_homes}
    for homes in account_homes().values():
        if not own.intersection(os.path.realpath(path) for path in homes):
            found.extend(homes)
    return [os.path.realpath(path) for path in found]


# The login files of each CLI under its account's directories (variable, relative path).
LOGIN_FILES = (
    ("CODEX_HOME", "auth.json"),
    ("CLAUDE_CONFIG_DIR", ".credentials.json"),
    ("XDG_DATA_HOME", "opencode/auth.json"),
    ("HOME", ".codex/auth.json"),
    ("HOME", ".claude/.credentials.json"),
)
_MAX_LOGIN_FILE = 1 << 20
_held_cache: list[tuple[float, dict[str, str]]] = []
_HELD_SECONDS = 30.0


def _json_secrets(node: object, name: str, found: dict[str, str]) -> None:
    """String values under names that look secret (token, key, secret ...) in a login file."""
    if isinstance(node, dict):
        for key, value in node.items():
            label = f"{name}.{key}"
            if isinstance(value, str) and looks_secret(str(key)):
                if len(value) >= MIN_LENGTH:
                    found.setdefault(value, label)
            else:
                _json_secrets(value, label, found)
    elif isinstance(node, list):
        for item in node:
            _json_secrets(item, name, found)


def _login_file_secrets(
    env: dict[str, str], account: str, found: dict[str, str]
) -> None:
    for variable, relative in LOGIN_FILES:
        base = env.get(variable)
        if not base:
            continue
        path = os.path.join(base, relative)
        try:
            with open(path, "rb") as handle:
                data = json.loads(handle.read(_MAX_LOGIN_FILE))
        except (OSError, ValueError):
            continue
        _json_secrets(data, f"{account}:{relative}", found)


def held_secrets() -> dict[str, str]:
    """NAME -> value of every secret loopsweb holds (module docstring); read at most every
    30 s per process."""
    now = time.monotonic()
    if _held_cache and now - _held_cache[0][0] < _HELD_SECONDS:
        return dict(_held_cache[0][1])
    from ledger.models import Account

    by_value: dict[str, str] = {}
    key = str(getattr(settings, "SECRET_KEY", "") or "")
    if len(key) >= MIN_LENGTH:
        by_value[key] = "SECRET_KEY"
    for alias, database in settings.DATABASES.items():
        password = str(database.get("PASSWORD") or "")
        if len(password) >= MIN_LENGTH:
            by_value.setdefault(password, f"DATABASE_PASSWORD_{alias}")
    url = os.environ.get("DATABASE_URL") or ""
    try:
        password = urlsplit(url).password or ""
    except ValueError:
        password = ""
    if len(password) >= MIN_LENGTH:
        by_value.setdefault(password, "DATABASE_PASSWORD")
    # A chat webhook's URL is its credential (docs/operations.md, "Notifications").
    notify_url = str(getattr(settings, "LOOPSWEB_NOTIFY_URL", "") or "")
    if len(notify_url) >= MIN_LENGTH:
        by_value.setdefault(notify_url, "LOOPSWEB_NOTIFY_URL")
    token_file = getattr(settings, "LOOPSWEB_GITHUB_TOKEN_FILE", None)
    files = [("github", str(token_file))] if token_file else []
    hook_file = getattr(settings, "LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE", None)
    files += [("github-webhook", str(hook_file))] if hook_file else []
    for row in Account.objects.only("name", "env_file", "env_json"):
        if row.env_file:
            files.append((row.name, row.env_file))
        env = {str(k): str(v) for k, v in (row.env_json or {}).items()}
        _login_file_secrets(env, row.name, by_value)
    for owner, path in files:
        try:
            values = read_env_file(path)
        except EnvFileError:
            continue
        for name, value in values.items():
            if len(value) >= MIN_LENGTH:
                by_value.setdefault(value, f"{owner}:{name}")
    held = {name: value for value, name in by_value.items()}
    _held_cache[:] = [(now, held)]
    return dict(held)


def held_secrets_forget() -> None:
    """The next `held_secrets` reads everything again (an account was added, say)."""
    _held_cache.clear()
