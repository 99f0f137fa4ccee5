"""A private, throwaway PostgreSQL server that a test may stop and start (a real outage).

Built on .ci/pg.sh (the same recipe as `make test`): `PrivateServer()` runs pg_start in a
shell and keeps its directory, port and binaries; `stop()` and `start()` drive pg_ctl on
that one cluster only; `destroy()` runs pg_stop, which removes it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PG_SH = ROOT / ".ci" / "pg.sh"


def _bash(script: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        ["bash", "-c", f"set -e; source {PG_SH}; {script}"],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pg helper failed: {result.stderr.strip()}")
    return result.stdout


class PrivateServer:
    def __init__(self) -> None:
        out = _bash('PG_PORT= pg_start; echo "$PG_ROOT $PG_PORT $PG_BIN"')
        self.root, self.port, self.bin = out.split()[-3:]
        self.base_url = f"postgres://postgres@127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return {"PG_ROOT": self.root, "PG_PORT": self.port, "PG_BIN": self.bin}

    def create_database(self, name: str) -> str:
        with psycopg.connect(f"{self.base_url}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
            # pg.sh turns synchronous commits off for speed; a crash would then lose the
            # last commits, which is not the outage under test. This database keeps them.
            conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
        return f"{self.base_url}/{name}"

    def stop(self) -> None:
        """Kill the server at once (`immediate`: no goodbye to clients, like a crash)."""
        _bash(
            'pg_as "$PG_BIN/pg_ctl" -D "$PG_ROOT/data" -m immediate -w stop >/dev/null',
            self._env(),
        )

    def start(self) -> None:
        _bash(
            'pg_as "$PG_BIN/pg_ctl" -D "$PG_ROOT/data" -l "$PG_ROOT/server.log" -w -t 60 '
            '-o "-p $PG_PORT -k $PG_ROOT -c listen_addresses=127.0.0.1 -c fsync=off" '
            "start >/dev/null",
            self._env(),
        )

    def destroy(self) -> None:
        _bash("pg_stop", self._env())


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    """A PrivateServer for the length of the block, removed after it (a test's fixture)."""
    pg = PrivateServer()
    try:
        yield pg
    finally:
        pg.destroy()
