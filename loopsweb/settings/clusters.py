"""The django-q2 clusters, the hosts of several machines, the admission lock, logging."""

from __future__ import annotations

import re
import socket

from django.core.exceptions import ImproperlyConfigured

from loopsweb.settings.env import (
    env_bool,
    env_int,
    env_str,
)

# django-q2: the ORM broker on the default database. `retry` must exceed `timeout`, or a
# long task's lock expires and the task is handed out twice; catch_up off so a cluster that
# was down does not replay every missed drain at once.
# A workflow run is one task: the timeout matches the one-shot loop lease upstream gives a run
# (90 min). A run that outlives it is killed and its lease recovery fails it cleanly.
Q_TIMEOUT = env_int("Q_TIMEOUT", 5400)
Q_RETRY = env_int("Q_RETRY", Q_TIMEOUT + 300)
if Q_RETRY <= Q_TIMEOUT:
    raise ImproperlyConfigured(
        f"Q_RETRY ({Q_RETRY}) must be greater than Q_TIMEOUT ({Q_TIMEOUT})"
    )
# Two clusters on one broker (django-q2 multi-queue). The main cluster (`qcluster`, Q_WORKERS)
# runs drains, schedules and lease recovery; agent runs, which last minutes to hours, go to
# their own queue and cluster (`Q_CLUSTER_NAME=loopsweb-runs qcluster`, LOOPSWEB_RUN_WORKERS),
# so they never hold the workers that keep the system moving. Tasks are kept apart by the ORM
# broker's queue key (the cluster name); `name` (the signing salt) is shared.
LOOPSWEB_RUN_CLUSTER = "loopsweb-runs"
LOOPSWEB_RUN_WORKERS = env_int("LOOPSWEB_RUN_WORKERS", 8)
# Several machines (ledger.hosts, docs/operations.md "Several machines"): each run cluster registers
# its host under this stable name and serves its own queue, `loopsweb-runs@<name>`.
LOOPSWEB_HOST_NAME = env_str("LOOPSWEB_HOST_NAME") or socket.gethostname()
if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}", LOOPSWEB_HOST_NAME):
    raise ImproperlyConfigured(
        "LOOPSWEB_HOST_NAME must be 1-80 letters, digits, '.', '_' or '-' (starting with "
        f"a letter or digit), got {LOOPSWEB_HOST_NAME!r}"
    )
# A host not heard from this long is dead: its queued runs move to live hosts at once.
LOOPSWEB_HOST_DEAD_SECONDS = env_int("LOOPSWEB_HOST_DEAD_SECONDS", 60)
# A run no live host serves (project roots, provider) waits this long, then fails.
LOOPSWEB_NO_HOST_GRACE_SECONDS = env_int("LOOPSWEB_NO_HOST_GRACE_SECONDS", 900)
# The admission lock (ledger.lock, PostgreSQL): a transaction that holds it and sends nothing
# for LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS (its process stopped, its network gone) is ended by
# the server, which releases the lock; a wait for it gives up after
# LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS. Both are errors that pass: the writer tries again.
LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS = env_int("LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS", 10)
LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS = env_int("LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS", 15)
Q_CLUSTER = {
    "name": "loopsweb",
    "orm": "default",
    "workers": env_int("Q_WORKERS", 2),
    "timeout": Q_TIMEOUT,
    "retry": Q_RETRY,
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "poll": 0.5,
    "save_limit": 1000,
    "sync": env_bool("Q_SYNC", False),
    # The ORM broker, patient with a passing database error (ledger.queue.PatientQueue).
    "broker_class": "ledger.queue.PatientQueue",
    "ALT_CLUSTERS": {
        LOOPSWEB_RUN_CLUSTER: {
            "workers": LOOPSWEB_RUN_WORKERS,
            # Take a run from the broker only when a worker can start it soon: a cluster
            # whose workers are all busy must not hoard runs another machine could start.
            "queue_limit": 1,
            # Schedules (drains, recovery) fire on the main cluster only.
            "scheduler": False,
            # This host's own queue first, then the shared one (ledger.queue.HostQueue).
            "broker_class": "ledger.queue.HostQueue",
        }
    },
}

LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper() or "INFO"
if LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(
        f"LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {LOG_LEVEL!r}"
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "one_line_warning": {"()": "loopsweb.middleware.OneLineWarning"},
        "passing_db_error": {"()": "ledger.dberrors.PassingErrorLine"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {
        "handlers": ["console"],
        "level": LOG_LEVEL,
    },
    "loggers": {
        # A bad Host header is a client's mistake (400), not our error: one WARNING line.
        "django.security.DisallowedHost": {"filters": ["one_line_warning"]},
        # A passing database error in django-q2's own processes: one line per outage.
        "django-q": {"filters": ["passing_db_error"]},
    },
}
