"""loopsweb settings, driven by the environment.

Every setting an operator may change is read from an environment variable (the README lists
them all). A bad value raises ImproperlyConfigured naming the variable, at start-up, rather
than failing later in a request or a worker.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from domain.bounds import BOUNDS, bounded_int
from domain.errors import ValidationError
from loopsweb.installation import (
    DEV_SECRET_KEY_FILE,
    INSTALLATION_ENV_FILE,
    development_secret_key,
    load_installation_env,
)

BASE_DIR = Path(__file__).resolve().parent.parent

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
        elif text.startswith("-") or "at most" not in str(exc):
            message = f"{name} must be >= {BOUNDS[name].minimum}"
        else:
            message = str(exc)
        raise ImproperlyConfigured(f"{message}, got {raw!r}") from None
    return default if value is None else value


def env_bounded(name: str, default: int) -> int:
    """An integer setting within its row of domain.bounds (README "Numeric bounds")."""
    raw = os.environ.get(name)
    try:
        value = bounded_int(name, raw)
    except ValidationError as exc:
        raise ImproperlyConfigured(f"{exc} (got {raw!r})") from None
    return default if value is None else value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


def _is_test_run() -> bool:
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


TESTING = _is_test_run()

# Where the SQLite database, the development key and other local state live by default.
DATA_DIR = Path(env_str("LOOPSWEB_DATA_DIR") or BASE_DIR / "var").resolve()
# The installation's own settings (`make run` writes DEBUG=1 there on first start), so every
# process of this installation, in any terminal, runs with the same configuration. The
# environment wins; the suite ignores the file (its environment is explicit).
if not TESTING:
    load_installation_env(DATA_DIR / INSTALLATION_ENV_FILE)

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not (DEBUG or TESTING):
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is off (generate one with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`)"
        )
    # Development and tests only: one key per installation, generated once into a private
    # file, so the web server, both clusters and every command sign and read the same tasks
    # and sessions survive restarts.
    SECRET_KEY = development_secret_key(DATA_DIR / DEV_SECRET_KEY_FILE)

ALLOWED_HOSTS = env_list(
    "ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if (DEBUG or TESTING) else []
)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])


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


# On every backend, not only SQLite's: the directory holds the installation's env file, the
# static files and, in development, the secret key.
private_directory(DATA_DIR)


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


INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "axes",
    "ledger",
    "routing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (STATIC_URL) straight from the web process, before anything reads a session.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "loopsweb.middleware.RejectUnstorablePathMiddleware",
    "routing.api.middleware.ApiErrorMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: it answers a locked-out login attempt.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "loopsweb.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "loopsweb.wsgi.application"
ASGI_APPLICATION = "loopsweb.asgi.application"


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
        # Persistent connections (checked before reuse) for the clusters by default: at 0
        # every broker poll (0.5 s) and heartbeat opens a connection of its own (issue 44:
        # 4.65 a second per idle run cluster). Web processes keep 0 unless told.
        cluster = sys.argv[1:2] == ["qcluster"]
        max_age = env_int("DATABASE_CONN_MAX_AGE", 60 if cluster else 0)
        db["CONN_MAX_AGE"] = max_age
        db["CONN_HEALTH_CHECKS"] = max_age > 0
    else:
        raise ImproperlyConfigured(
            f"DATABASE_URL must be sqlite:// or postgres://, got engine {engine!r}"
        )
    return db


DATABASES = {"default": _database_settings()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {
        "NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"
    },
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
# One date format everywhere (admin lists and pages, /ops/): `2026-11-29 16:40:03 UTC`.
FORMAT_MODULE_PATH = ["loopsweb.formats"]

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# --- static ---
# The admin's and /ops/'s CSS and scripts. In production (`scripts/serve.sh`) `collectstatic`
# copies them into STATIC_ROOT under content-hashed names with gzip/Brotli copies (WhiteNoise's
# CompressedManifestStaticFilesStorage) and WhiteNoise serves them from every web process with
# far-future cache headers. Without the manifest (development and the suite's processes,
# LOOPSWEB_STATIC_MANIFEST=0) pages name the files as they are and WhiteNoise finds them in
# the apps, so nothing has to be collected first.
LOOPSWEB_STATIC_MANIFEST = env_bool("LOOPSWEB_STATIC_MANIFEST", not (DEBUG or TESTING))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if LOOPSWEB_STATIC_MANIFEST
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = not LOOPSWEB_STATIC_MANIFEST
WHITENOISE_AUTOREFRESH = not LOOPSWEB_STATIC_MANIFEST
# --- end static ---

# --- web server ---
# gunicorn (loopsweb/gunicorn.conf.py reads these): where it listens (unless systemd hands it
# a socket), how many worker processes and threads each, and how long a request may take.
# LOOPSWEB_PORT (what `make run` listens on) also sets the default bind, so one variable
# moves both servers.
_DEFAULT_BIND = f"127.0.0.1:{env_str('LOOPSWEB_PORT') or '8000'}"
LOOPSWEB_BIND = env_str("LOOPSWEB_BIND", _DEFAULT_BIND) or _DEFAULT_BIND
LOOPSWEB_WEB_WORKERS = env_int("LOOPSWEB_WEB_WORKERS", 2)
LOOPSWEB_WEB_THREADS = env_int("LOOPSWEB_WEB_THREADS", 4)
LOOPSWEB_WEB_TIMEOUT = env_int("LOOPSWEB_WEB_TIMEOUT", 60)
for _name, _value, _most in (
    ("LOOPSWEB_WEB_WORKERS", LOOPSWEB_WEB_WORKERS, 64),
    ("LOOPSWEB_WEB_THREADS", LOOPSWEB_WEB_THREADS, 64),
    ("LOOPSWEB_WEB_TIMEOUT", LOOPSWEB_WEB_TIMEOUT, 3600),
):
    if _value > _most:
        raise ImproperlyConfigured(f"{_name} must be <= {_most}, got {_value}")
# --- end web server ---

LOGIN_URL = "admin:login"
CSRF_FAILURE_VIEW = "routing.api.middleware.csrf_failure"

# Login brute-force protection (django-axes): after LOOPSWEB_LOGIN_FAILURE_LIMIT failed
# logins for one username from one address, that pair is refused (429) for
# LOOPSWEB_LOGIN_COOLOFF_MINUTES, even with the right password; after
# LOOPSWEB_LOGIN_IP_FAILURE_LIMIT failures from one address whatever the usernames, the
# address is (loopsweb.login: the second rule, with its own limit). Attempts are rows in the
# database, so every web process shares the count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = env_bool("LOOPSWEB_LOGIN_PROTECTION", True)
AXES_FAILURE_LIMIT = env_int("LOOPSWEB_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_int("LOOPSWEB_LOGIN_COOLOFF_MINUTES", 15) / 60  # hours
_LOCKOUT_BY = env_str("LOOPSWEB_LOGIN_LOCKOUT_BY", "username+ip")
# django-axes' lockout parameters: a list of names, or of lists of names combined
_LOCKOUT_PARAMETERS: dict[str, list[str | list[str]]] = {
    "username+ip": [["username", "ip_address"]],
    "username": ["username"],
    "ip": ["ip_address"],
}
if _LOCKOUT_BY not in _LOCKOUT_PARAMETERS:
    raise ImproperlyConfigured(
        f"LOOPSWEB_LOGIN_LOCKOUT_BY must be username+ip, username or ip, got {_LOCKOUT_BY!r}"
    )
LOOPSWEB_LOGIN_LOCKOUT_RULE = _LOCKOUT_PARAMETERS[_LOCKOUT_BY]
LOOPSWEB_LOGIN_IP_FAILURE_LIMIT = env_int("LOOPSWEB_LOGIN_IP_FAILURE_LIMIT", 30)
if LOOPSWEB_LOGIN_IP_FAILURE_LIMIT < AXES_FAILURE_LIMIT:
    raise ImproperlyConfigured(
        f"LOOPSWEB_LOGIN_IP_FAILURE_LIMIT ({LOOPSWEB_LOGIN_IP_FAILURE_LIMIT}) must be at "
        f"least LOOPSWEB_LOGIN_FAILURE_LIMIT ({AXES_FAILURE_LIMIT})"
    )
AXES_LOCKOUT_PARAMETERS = "loopsweb.login.lockout_parameters"
AXES_RESET_ON_SUCCESS = True
# django-axes prints "AXES: BEGIN version ..." on every start (every command's stderr).
AXES_VERBOSE = False
# The client address is REMOTE_ADDR (behind a proxy: the proxy's, so the count is per username).
# Where a login lands when its `next` is missing or unsafe (Django's default is a 404).
LOGIN_REDIRECT_URL = "admin:index"

# Production hardening (python manage.py check --deploy passes with DEBUG off and HTTPS on).
SECURE_HTTPS = env_bool("LOOPSWEB_HTTPS", not (DEBUG or TESTING))
SESSION_COOKIE_SECURE = SECURE_HTTPS
CSRF_COOKIE_SECURE = SECURE_HTTPS
SECURE_SSL_REDIRECT = SECURE_HTTPS and env_bool("LOOPSWEB_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env_int("LOOPSWEB_HSTS_SECONDS", 31536000 if SECURE_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = SECURE_HSTS_SECONDS > 0
# Behind a proxy (LOOPSWEB_BEHIND_PROXY=1) Django reads X-Forwarded-Proto, and gunicorn
# trusts forwarded headers from LOOPSWEB_PROXY_IPS only (default loopback); otherwise neither
# trusts them, from anyone.
LOOPSWEB_BEHIND_PROXY = env_bool("LOOPSWEB_BEHIND_PROXY")
LOOPSWEB_PROXY_IPS = env_list("LOOPSWEB_PROXY_IPS", ["127.0.0.1", "::1"])
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if LOOPSWEB_BEHIND_PROXY else None
)
# A load balancer's or systemd's health probe may speak plain HTTP to the web port.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

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
# Several machines (ledger.hosts, README "Running on N machines"): each run cluster registers
# its host under this stable name and serves its own queue, `loopsweb-runs@<name>`.
LOOPSWEB_HOST_NAME = env_str("LOOPSWEB_HOST_NAME") or socket.gethostname()
if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}", LOOPSWEB_HOST_NAME):
    raise ImproperlyConfigured(
        "LOOPSWEB_HOST_NAME must be 1-80 letters, digits, '.', '_' or '-' (starting with "
        f"a letter or digit), got {LOOPSWEB_HOST_NAME!r}"
    )
# A host not heard from this long is dead: its queued runs move to live hosts at once.
LOOPSWEB_HOST_DEAD_SECONDS = env_bounded("LOOPSWEB_HOST_DEAD_SECONDS", 60)
# A run no live host serves (project roots, provider) waits this long, then fails.
LOOPSWEB_NO_HOST_GRACE_SECONDS = env_bounded("LOOPSWEB_NO_HOST_GRACE_SECONDS", 900)
# The admission lock (ledger.lock, PostgreSQL): a transaction that holds it and sends nothing
# for LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS (its process stopped, its network gone) is ended by
# the server, which releases the lock; a wait for it gives up after
# LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS. Both are errors that pass: the writer tries again.
LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS = env_bounded(
    "LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS", 10
)
LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS = env_bounded(
    "LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS", 15
)
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

# Upstream index names (e.g. idx_workflow_work_items_status_next) exceed Django's 30-character
# portability limit, which exists for Oracle; SQLite and PostgreSQL (63) accept them.
SILENCED_SYSTEM_CHECKS = ["models.E034"]

# Largest event envelope (or request body) accepted, in bytes.
LOOPSWEB_MAX_EVENT_BYTES = env_int("LOOPSWEB_MAX_EVENT_BYTES", 1024 * 1024)

# --- runner ---
# The workflow runner (ledger.runner) and its provider adapters (ledger.providers). Every value
# is read at call time through django.conf.settings, so tests may override them.

# Agent binaries, one per provider: a name looked up on PATH or an absolute path.
_PROVIDER_BINARY_DEFAULTS = {
    "codewith": "codewith",
    "claude": "claude",
    "codex": "codex",
    "cursor": "cursor-agent",
    "opencode": "opencode",
    "aicopilot": "aicopilot",
}
LOOPSWEB_PROVIDER_BINARIES = {
    provider: env_str(f"LOOPSWEB_{provider.upper()}_BIN") or default
    for provider, default in _PROVIDER_BINARY_DEFAULTS.items()
}


def _exit_codes(name: str) -> frozenset[int]:
    codes = set()
    for part in env_list(name, []):
        try:
            code = bounded_int(name, part, minimum=0, key="rate-limit exit code")
        except ValidationError:
            raise ImproperlyConfigured(
                f"{name} must be a comma list of integers from 0 to 255, got {part!r}"
            ) from None
        if code is not None:
            codes.add(code)
    return frozenset(codes)


# Exit codes that mean "rate limited" for a provider (besides 429 / rate-limit output).
LOOPSWEB_RATE_LIMIT_EXIT_CODES = {
    provider: _exit_codes(f"LOOPSWEB_{provider.upper()}_RATE_LIMIT_EXIT_CODES")
    for provider in _PROVIDER_BINARY_DEFAULTS
}
# A running run's lease; the runner renews it about three times per lease while it lives.
# Recovery fails runs whose lease expired, so this bounds how long a crashed worker pins an
# account and a cap slot.
LOOPSWEB_RUN_LEASE_SECONDS = env_int("LOOPSWEB_RUN_LEASE_SECONDS", 120)
# Bytes of stdout and of stderr kept per step (the tail; older output is dropped).
# Drain records that did nothing (no candidate considered, no error) are kept this many days,
# then pruned by the `prune-empty-drains` schedule; records that did something are kept.
LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS = env_int("LOOPSWEB_DRAIN_EMPTY_RETENTION_DAYS", 7)
LOOPSWEB_OUTPUT_TAIL_BYTES = env_int("LOOPSWEB_OUTPUT_TAIL_BYTES", 65536)
# Cooldown after a rate limit that names no reset time: base × 2^(reports−1), capped.
LOOPSWEB_COOLDOWN_BASE_SECONDS = env_int("LOOPSWEB_COOLDOWN_BASE_SECONDS", 60)
LOOPSWEB_COOLDOWN_CAP_SECONDS = env_int("LOOPSWEB_COOLDOWN_CAP_SECONDS", 3600)
# How often a run waiting for its step's account (at cap or cooling) checks again.
LOOPSWEB_STEP_START_POLL_SECONDS = env_int("LOOPSWEB_STEP_START_POLL_SECONDS", 5)
# Seconds between SIGTERM and SIGKILL when a step's process group is stopped.
LOOPSWEB_KILL_GRACE_SECONDS = env_int("LOOPSWEB_KILL_GRACE_SECONDS", 5)
# How often an agent CLI retries a failed model call (codex, claude; ledger/providers.py):
# few, so a rate limit reaches loopsweb in seconds and the step can move to another account.
LOOPSWEB_AGENT_MAX_RETRIES = env_int("LOOPSWEB_AGENT_MAX_RETRIES", 1)
# How many times a rate-limited agent step moves to another free member of its run's pool
# before the run fails (ledger.services.failover).
LOOPSWEB_RATE_LIMIT_MOVES = env_int("LOOPSWEB_RATE_LIMIT_MOVES", 2)
# Every agent step's time limits unless its route (--step-timeout, --step-idle-timeout) or
# the step itself (timeoutMs, idleTimeoutMs) says otherwise: in total, and without output.
LOOPSWEB_STEP_TIMEOUT_SECONDS = env_int("LOOPSWEB_STEP_TIMEOUT_SECONDS", 3600)
LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS = env_int("LOOPSWEB_STEP_IDLE_TIMEOUT_SECONDS", 600)
# An agent CLI that reports this many failed model calls in a row, with no model answer or
# tool call between them, is stopped with the provider's error (ledger.agent_step).
LOOPSWEB_STEP_PROVIDER_ERRORS = env_int("LOOPSWEB_STEP_PROVIDER_ERRORS", 3)
# How long a step of a pool-routed run waits when every account of its pool is rate
# limited (holding no run worker), before its run fails with that reason (ledger.runner).
LOOPSWEB_POOL_WAIT_SECONDS = env_int("LOOPSWEB_POOL_WAIT_SECONDS", 3600)
# How often a running step's output tails are written to its step run (only when it printed
# something new), so /ops/ and the item page show what the agent is doing now.
LOOPSWEB_OUTPUT_FLUSH_SECONDS = env_int("LOOPSWEB_OUTPUT_FLUSH_SECONDS", 5)
# Loop-level retries (--max-attempts): the delay doubles per failed attempt up to this cap.
LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS = env_int("LOOPSWEB_RETRY_BACKOFF_CAP_SECONDS", 3600)
# --- end runner ---

# --- isolation ---
# Where agents may run (ledger.projects, ledger.worktrees; README "Isolation").


def _absolute_dirs(name: str, raw: list[str]) -> tuple[str, ...]:
    # No `~` expansion and no relative paths: a root is exactly the directory named.
    for part in raw:
        if not os.path.isabs(part) or "\x00" in part:
            raise ImproperlyConfigured(f"{name} must list absolute paths, got {part!r}")
    return tuple(os.path.normpath(part) for part in raw)


# Directories project paths must resolve into (symlinks followed). Empty: no agent runs.
LOOPSWEB_PROJECT_ROOTS = _absolute_dirs(
    "LOOPSWEB_PROJECT_ROOTS", env_list("LOOPSWEB_PROJECT_ROOTS", [])
)
# Per-run git worktrees live here, one directory per run.
_worktree_dir = env_str("LOOPSWEB_WORKTREE_DIR")
if _worktree_dir and not os.path.isabs(_worktree_dir):
    raise ImproperlyConfigured(
        f"LOOPSWEB_WORKTREE_DIR must be an absolute path, got {_worktree_dir!r}"
    )
LOOPSWEB_WORKTREE_DIR = os.path.normpath(_worktree_dir or str(DATA_DIR / "worktrees"))
# A failed run's worktree is kept this long for an operator to look at, then pruned.
LOOPSWEB_WORKTREE_KEEP_SECONDS = env_int(
    "LOOPSWEB_WORKTREE_KEEP_SECONDS", 3 * 24 * 3600
)
# The git binary that creates and removes worktrees (a name on PATH or an absolute path).
LOOPSWEB_GIT_BIN = env_str("LOOPSWEB_GIT_BIN") or "git"


def _passthrough(name: str) -> tuple[str, ...]:
    # Names (or `PREFIX*` patterns) of worker variables an agent may also see. Naming one of
    # loopsweb's own settings is refused here; the runner drops them whatever a pattern says.
    names = tuple(env_list(name, []))
    for entry in names:
        stem = entry[:-1] if entry.endswith("*") else entry
        if not stem or not all(c.isalnum() or c == "_" for c in stem):
            raise ImproperlyConfigured(
                f"{name} must list variable names or PREFIX* patterns, got {entry!r}"
            )
        if stem.startswith("LOOPSWEB_") or stem in ("DATABASE_URL", "SECRET_KEY"):
            raise ImproperlyConfigured(
                f"{name} may not pass loopsweb's own settings to agents, got {entry!r}"
            )
    return names


LOOPSWEB_AGENT_ENV_PASSTHROUGH = _passthrough("LOOPSWEB_AGENT_ENV_PASSTHROUGH")
# --- end isolation ---

# Largest JSON-array file `ingest_events` loads at once (JSON Lines files stream, unbounded).
LOOPSWEB_MAX_INGEST_BYTES = env_int("LOOPSWEB_MAX_INGEST_BYTES", 256 * 1024 * 1024)
# How long a drain that lost its database connection keeps trying to store its record.
LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS = env_int("LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS", 30)
# Most candidates a drain decides in one admission transaction (one lock hold, counts read
# once, rows written in bulk); 1 routes them one at a time.
LOOPSWEB_DRAIN_BATCH_SIZE = env_int("LOOPSWEB_DRAIN_BATCH_SIZE", 50)
# Largest output accepted from a drain's --source-command, in bytes.
LOOPSWEB_SOURCE_MAX_BYTES = env_int("LOOPSWEB_SOURCE_MAX_BYTES", 16 * 1024 * 1024)

# --- api ---
# The event API (routing.api.views), API tokens and /metrics. Read through django.conf.settings
# at request time, so tests may override them. The request body limit is
# LOOPSWEB_MAX_EVENT_BYTES above: one limit for one envelope, whatever the entry point.

# Most envelopes in one POST /api/v1/events array (larger batches: ingest_events).
LOOPSWEB_API_MAX_EVENTS = env_int("LOOPSWEB_API_MAX_EVENTS", 1000)
# Deepest bracket nesting of one envelope (API, ingest_events, route_event). Checked on the
# text before parsing, so a hostile body cannot exhaust the parser's recursion.
LOOPSWEB_MAX_JSON_DEPTH = env_int("LOOPSWEB_MAX_JSON_DEPTH", 32)
# --- end api ---
