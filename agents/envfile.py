"""An account's env file: the API key of an account whose login is a key (no Django).

`account add NAME --env-file PATH` stores only PATH (`Account.env_file`); the runner reads
the file when a step on the account starts (`read_env_file`), so the key lives in the file,
never in the database, the admin, `/ops/`, the API or a log line. Every value of the file is
also a secret of the steps on the account: the runner replaces it by `[redacted:NAME]` in
what the agent printed, the step's error and everything built from them before they are
stored (agents.redaction; values under 8 characters are left as they are).

Format: `NAME=value` lines; blank lines and lines starting with `#` are skipped; an optional
`export ` before the name; a value wrapped in one pair of matching quotes loses them, and is
otherwise taken as written (no expansion, no escapes).

The file is opened once (`O_NOFOLLOW`, and `O_NONBLOCK`/`O_NOCTTY` so a FIFO or a terminal
cannot hang the read), checked with `fstat` on that descriptor and read from it only: the
file checked is the file read, and a file swapped in or loosened meanwhile is refused.

Refused, with an error naming the file and a line number, never the text of a line:
1. a relative path, a missing file, anything but a regular file (a symlink included);
2. a file not owned by the current user, or whose mode is not 0600 (readable or writable by
   anyone else, or executable);
3. a file over MAX_BYTES (64 KiB): refused, never cut;
4. a line that is not `NAME=value`, a name that is not a variable name (not shown: it may be
   a key pasted without its name) or is loopsweb's own (`LOOPSWEB_*`, `DATABASE_URL`,
   `SECRET_KEY`, ...), a value with a NUL byte.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from domain.errors import ApplicationError

ENV_FILE_RELATIVE = "env file must be an absolute path: {path}"
ENV_FILE_MISSING = "env file {path} cannot be read: {reason}"
ENV_FILE_NOT_REGULAR = "env file {path} is not a regular file"
ENV_FILE_SYMLINK = "env file {path} is not a regular file (a symbolic link is refused)"
ENV_FILE_OWNER = "env file {path} is owned by uid {owner}, not by the user loopsweb runs as (uid {uid})"
ENV_FILE_MODE = (
    "env file {path} has mode {mode:04o}; it holds a secret and must be 0600 "
    "(chmod 600 {path})"
)
ENV_FILE_TOO_LARGE = (
    "env file {path} is larger than {limit} bytes, the most an env file may hold; "
    "it is refused, never cut"
)
ENV_FILE_LINE = "env file {path}, line {number}: not NAME=value"
ENV_FILE_NAME = (
    "env file {path}, line {number}: the text before '=' is not a variable name"
)
ENV_FILE_RESERVED = "env file {path}, line {number}: {name} is loopsweb's own and never reaches an agent"
ENV_FILE_VALUE = "env file {path}, line {number}: the value of {name} has a NUL byte"

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# loopsweb's own variables, which never reach an agent or command (runs.providers).
_RESERVED_NAMES = frozenset(
    {"DATABASE_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE", "PG_TEST_URL"}
)
_RESERVED_PREFIXES = ("LOOPSWEB_",)
MAX_BYTES = 64 * 1024
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def reserved_variable(name: str) -> bool:
    """True for loopsweb's own variables, which never reach an agent or command."""
    return name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIXES)


class EnvFileError(ApplicationError):
    """An env file that cannot be used (the message names the file, never its content)."""


def _check_info(path: str, info: os.stat_result) -> None:
    """The refusals of the module docstring that the fstat of the open file decides: anything
    but a regular file, an owner or a mode not allowed, a size over MAX_BYTES."""
    if not stat.S_ISREG(info.st_mode):
        raise EnvFileError(ENV_FILE_NOT_REGULAR.format(path=path))
    if info.st_uid != os.geteuid():
        raise EnvFileError(
            ENV_FILE_OWNER.format(path=path, owner=info.st_uid, uid=os.geteuid())
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o600:
        raise EnvFileError(ENV_FILE_MODE.format(path=path, mode=mode))
    if info.st_size > MAX_BYTES:
        raise EnvFileError(ENV_FILE_TOO_LARGE.format(path=path, limit=MAX_BYTES))


def _read_checked(path: str) -> bytes:
    """The bytes of the env file at `path`, opened once and checked on its descriptor."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise EnvFileError(ENV_FILE_RELATIVE.format(path=path))
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: the path is a symbolic link
            raise EnvFileError(ENV_FILE_SYMLINK.format(path=path)) from None
        raise EnvFileError(
            ENV_FILE_MISSING.format(path=path, reason=exc.strerror)
        ) from None
    try:
        _check_info(path, os.fstat(fd))
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES:  # the file may have grown since the fstat
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise EnvFileError(
            ENV_FILE_MISSING.format(path=path, reason=exc.strerror)
        ) from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise EnvFileError(ENV_FILE_TOO_LARGE.format(path=path, limit=MAX_BYTES))
    return b"".join(chunks)


def read_env_file(path: str) -> dict[str, str]:
    """The variables of the env file at `path` (module docstring), or EnvFileError."""
    text = _read_checked(path).decode("utf-8", errors="replace")
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export ") :].lstrip()
        name, sep, value = stripped.partition("=")
        name = name.strip()
        if not sep:
            raise EnvFileError(ENV_FILE_LINE.format(path=path, number=number))
        if not _NAME_RE.match(name):
            raise EnvFileError(ENV_FILE_NAME.format(path=path, number=number))
        if reserved_variable(name):
            raise EnvFileError(
                ENV_FILE_RESERVED.format(path=path, number=number, name=name)
            )
        if "\x00" in value:
            raise EnvFileError(
                ENV_FILE_VALUE.format(path=path, number=number, name=name)
            )
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[name] = value
    return env
