"""One installation, one configuration: the files in LOOPSWEB_DATA_DIR that every process of an
installation reads at start-up (loopsweb/settings/base.py calls these before it reads the environment).

- `loopsweb.env`: the installation's settings as `NAME=value` lines (`#` comments). `make run`
  writes `DEBUG=1` and `LOOPSWEB_HTTPS=0` there on its first start, so a command typed in a
  second terminal runs with the configuration the web server and the clusters use. A variable
  set in the environment always wins over the file.
- `secret_key`: the development SECRET_KEY, generated once (0600). Tasks are signed with the
  key: a cluster with another key drops what the web server or a command queued.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

INSTALLATION_ENV_FILE = "loopsweb.env"
DEV_SECRET_KEY_FILE = "secret_key"


def load_installation_env(path: Path) -> None:
    """Apply `path`'s NAME=value lines to os.environ where the environment has no value."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ImproperlyConfigured(f"cannot read {path}: {exc}") from None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ImproperlyConfigured(
                f"{path}:{number}: expected NAME=value, got {raw!r}"
            )
        os.environ.setdefault(name, value.strip())


def development_secret_key(path: Path) -> str:
    """The installation's development key: read `path`, or create it once (0600).

    Two processes starting at the same moment both end with the same key: the key is written
    to a private temporary file and linked into place, which fails for the second writer, and
    a reader never sees a half-written file.
    """
    try:
        key = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        key = ""
    except OSError as exc:
        raise ImproperlyConfigured(f"cannot read {path}: {exc}") from None
    if key:
        return key
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    candidate = "dev-" + secrets.token_urlsafe(40)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(candidate + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process won: use its key
    finally:
        tmp.unlink(missing_ok=True)
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise ImproperlyConfigured(f"{path} is empty: delete it to generate a new key")
    return key
