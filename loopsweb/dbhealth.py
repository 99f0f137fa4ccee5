"""A damaged SQLite file is one clear line, not a traceback (README "Configuration").

`manage.py` runs every command through `run_command`: a database error that says the SQLite
file itself is damaged ("database disk image is malformed", "file is not a database") ends
the process with one line naming the file and what to do, exit 1, whether it surfaces in the
command's own thread or in another one (runserver serves from a thread, under the
autoreloader). Any other error is left as it was.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator

CORRUPT = ("database disk image is malformed", "file is not a database")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def corrupt_database_message(exc: BaseException) -> str | None:
    """The one line for an error caused by a damaged SQLite file, else None."""
    from django.db import DatabaseError

    for error in _chain(exc):
        if not isinstance(error, (sqlite3.DatabaseError, DatabaseError)):
            continue
        text = str(error).strip()
        if text.lower() in CORRUPT:
            return (
                f"loopsweb: the SQLite database {_sqlite_file()} is damaged ({text}): "
                "stop every loopsweb process, then restore the file from a backup, or move "
                "it and its -wal and -shm files aside and run `manage.py migrate` to start "
                "an empty one"
            )
    return None


def _sqlite_file() -> str:
    from django.conf import settings

    try:
        return str(settings.DATABASES["default"]["NAME"])
    except Exception:  # settings themselves failed: say what we can
        return "file"


def _thread_hook(previous: Callable[[threading.ExceptHookArgs], object]) -> Callable:
    def hook(args: threading.ExceptHookArgs) -> None:
        message = corrupt_database_message(args.exc_value) if args.exc_value else None
        if message is None:
            previous(args)
            return
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        # The way runserver itself stops when its port is taken: a thread cannot sys.exit
        # the process, and the autoreloader's parent exits with the child's status.
        os._exit(1)

    return hook


def run_command(argv: list[str]) -> None:
    from django.core.management import execute_from_command_line

    threading.excepthook = _thread_hook(threading.excepthook)
    try:
        execute_from_command_line(argv)
    except Exception as exc:
        message = corrupt_database_message(exc)
        if message is None:
            raise
        sys.stderr.write(message + "\n")
        sys.exit(1)
