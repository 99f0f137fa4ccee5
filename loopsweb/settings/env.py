"""The readers of the environment every settings module uses, and the start-up checks of
the data directory and the SQLite files (once one settings module)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from domain.bounds import BOUNDS, TooLarge, bounded_int
from domain.errors import ValidationError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name} must be a boolean (1/0, true/false, yes/no, on/off), got {raw!r}"
    )


def env_int(name: str, default: int) -> int:
    """A whole number within its row of the bounds table (domain.bounds), or the default.

    Parsed by `bounded_int` (no int() of a 5,000-digit value); the messages say which rule
    the value broke: not an integer, below the minimum, above the maximum.
    """
    raw = os.environ.get(name)
    try:
        value = bounded_int(name, raw)
    except ValidationError as exc:
        text = (raw or "").strip()
        digits = text[1:] if text.startswith("-") else text
        if not (digits.isascii() and digits.isdigit()):
            message = f"{name} must be an integer"
        elif text.startswith("-") or not isinstance(exc, TooLarge):
            message = f"{name} must be >= {BOUNDS[name].minimum}"
        else:
            message = str(exc)
        raise ImproperlyConfigured(f"{message}, got {raw!r}") from None
    return default if value is None else value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


def is_test_run() -> bool:
    """True only in the pytest process itself (its own executable or `python -m pytest`).

    Not an environment variable, and not "pytest was imported": either would let a production
    process drop its SECRET_KEY requirement and HTTPS settings. Processes the suite spawns
    get explicit settings from tests/conftest.py instead.
    """
    if "pytest" not in sys.modules or not sys.argv:
        return False
    entry = Path(sys.argv[0])
    return entry.name in {"pytest", "py.test"} or (
        entry.name == "__main__.py" and entry.parent.name == "pytest"
    )


def private_directory(path: Path) -> None:
    """Create `path` as 0700; tighten it to 0700 when it exists and is ours.

    The SQLite database holds session keys and password hashes. A directory another user
    owns, or a shared sticky one like /tmp, is left as it is (its mode is not ours to change).
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
        if info.st_uid == os.getuid() and not info.st_mode & 0o1000:
            os.chmod(path, 0o700)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"cannot create the data directory {path}: {exc.strerror}"
        ) from None


def private_sqlite_files(name: str) -> None:
    """The SQLite database and its -wal/-shm files are 0600 (created so, tightened if not).

    SQLite gives the -wal and -shm files the mode of the database file, so creating the
    database 0600 before SQLite opens it keeps every later one private too.
    """
    try:
        os.close(os.open(name, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError as exc:
        raise ImproperlyConfigured(
            f"cannot open the SQLite database {name}: {exc.strerror}"
        ) from None
    for path in (name, f"{name}-wal", f"{name}-shm"):
        try:
            if os.stat(path).st_uid == os.getuid():
                os.chmod(path, 0o600)
        except FileNotFoundError:
            pass
