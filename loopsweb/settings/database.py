"""The database (DATABASE_URL, SQLite's file and pragmas, PostgreSQL's connections)."""

from __future__ import annotations

import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from loopsweb.settings.base import DATA_DIR
from loopsweb.settings.env import (
    env_int,
    env_str,
    private_directory,
    private_sqlite_files,
)


def _database_settings() -> dj_database_url.DBConfig:
    url = env_str("DATABASE_URL")
    if not url:
        url = f"sqlite:///{DATA_DIR / 'loopsweb.sqlite3'}"
    try:
        db = dj_database_url.parse(url)
    except Exception as exc:  # dj-database-url raises several types for bad URLs
        raise ImproperlyConfigured(
            f"DATABASE_URL is not a valid database URL: {exc}"
        ) from None
    engine = db.get("ENGINE", "")
    if engine == "django.db.backends.sqlite3":
        name = str(db.get("NAME") or "")
        if not name or name == ":memory:":
            raise ImproperlyConfigured(
                "DATABASE_URL must name a SQLite file (in-memory databases are not supported)"
            )
        private_directory(Path(name).parent)
        private_sqlite_files(name)
        db["OPTIONS"] = {
            # BEGIN IMMEDIATE: every atomic() takes the write lock up front, so two admissions
            # never read the same counts (and never fail with "database is locked" on upgrade).
            "transaction_mode": "IMMEDIATE",
            "timeout": env_int("SQLITE_BUSY_TIMEOUT", 20),
            "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA foreign_keys=ON",
        }
        # Tests use threads and processes: the test database must be a file, not memory.
        test_name = env_str("SQLITE_TEST_NAME") or str(
            Path(name).with_name("test_" + Path(name).name)
        )
        db["TEST"] = {"NAME": test_name}
    elif engine in (
        "django.db.backends.postgresql",
        "django.db.backends.postgresql_psycopg2",
    ):
        db["ENGINE"] = "django.db.backends.postgresql"
    else:
        raise ImproperlyConfigured(
            f"DATABASE_URL must be sqlite:// or postgres://, got engine {engine!r}"
        )
    # Persistent connections (checked before reuse) for the clusters by default: at 0 every
    # broker poll (0.5 s) and heartbeat opens a connection of its own (measured: 4.65 a
    # second per idle run cluster on PostgreSQL; on SQLite, each open runs the pragmas above
    # again, most of an idle poll's CPU). Web processes and commands keep 0 unless told.
    cluster = sys.argv[1:2] == ["qcluster"]
    max_age = env_int("DATABASE_CONN_MAX_AGE", 60 if cluster else 0)
    db["CONN_MAX_AGE"] = max_age
    db["CONN_HEALTH_CHECKS"] = max_age > 0
    return db


DATABASES = {"default": _database_settings()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Upstream index names (e.g. idx_workflow_work_items_status_next) exceed Django's 30-character
# portability limit, which exists for Oracle; SQLite and PostgreSQL (63) accept them.
SILENCED_SYSTEM_CHECKS = ["models.E034"]
