"""Paths, secrets, hosts, the apps and their wiring, i18n (loopsweb.settings)."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from loopsweb.installation import (
    DEV_SECRET_KEY_FILE,
    INSTALLATION_ENV_FILE,
    development_secret_key,
    load_installation_env,
)
from loopsweb.settings.env import (
    env_bool,
    env_list,
    env_str,
    is_test_run,
    private_directory,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent


TESTING = is_test_run()

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


# On every backend, not only SQLite's: the directory holds the installation's env file, the
# static files and, in development, the secret key.
private_directory(DATA_DIR)


INSTALLED_APPS = [
    "loopsweb.admin_site.AdminConfig",  # the admin, discovered with the pages
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ledger",
    # Before django_q: runs' `qcluster` command (a run cluster's start) is the one that
    # runs (Django takes a command from the first app in this list that has it).
    "runs",
    "django_q",
    "axes",
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
                "routing.ops.context.agent_sandbox",
            ],
        },
    },
]

WSGI_APPLICATION = "loopsweb.wsgi.application"
ASGI_APPLICATION = "loopsweb.asgi.application"

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
