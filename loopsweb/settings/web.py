"""The web process: static files, the WSGI server, logins and HTTPS."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from loopsweb.settings.base import DATA_DIR, DEBUG, TESTING
from loopsweb.settings.env import (
    env_bool,
    env_int,
    env_list,
    env_str,
)

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
SECURE_REDIRECT_EXEMPT = [r"^(healthz|readyz|livez|health/installation)$"]
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
