"""A damaged SQLite file is one clear line, not a traceback (docs/operations.md, "A damaged
SQLite file").

`manage.py` runs every command through `run_command`: a database error that says the SQLite
file itself is damaged ("database disk image is malformed", "file is not a database") ends
the process with one line naming the file and what to do, exit 1, whether it surfaces in the
command's own thread or in another one (runserver serves from a thread, under the
autoreloader). A database error that passes (ledger.dberrors: a full disk, a read-only or
locked database, a lost connection, a server out of connections) that a command did not handle
itself is one line too: what the database said, that the transaction it was in was rolled
back, and to run it again once the database takes writes; exit 1. Any other error is left as
it was.
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


PASSING = (
    "loopsweb: the database did not take the command ({error}); the transaction it was "
    "in was rolled back. Run it again once the database takes writes (free space, make "
    "it writable, or wait for the server)"
)


def passing_error_message(exc: BaseException) -> str | None:
    """The one line for a database error that passes, else None."""
    from ledger.dberrors import error_passes, first_line

    return PASSING.format(error=first_line(exc)) if error_passes(exc) else None


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


def _closed_pipe() -> None:
    """The reader went away (`drain | head -1`): stop quietly, as a shell tool does, with
    no traceback; stdout is pointed at the null device so the exit flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(1)


def run_command(argv: list[str]) -> None:
    from django.core.management import execute_from_command_line

    threading.excepthook = _thread_hook(threading.excepthook)
    try:
        execute_from_command_line(argv)
        sys.stdout.flush()  # here, not at exit, so a closed pipe is caught below
    except BrokenPipeError:
        _closed_pipe()
    except Exception as exc:
        message = corrupt_database_message(exc) or passing_error_message(exc)
        if message is None:
            raise
        sys.stderr.write(message + "\n")
        sys.exit(1)
