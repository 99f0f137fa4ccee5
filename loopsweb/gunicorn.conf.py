"""gunicorn's configuration for loopsweb: `gunicorn -c loopsweb/gunicorn.conf.py loopsweb.wsgi`
(scripts/serve.sh web does this).

Every value comes from loopsweb's settings (loopsweb/settings/web.py, "web server"), so the
environment, `$LOOPSWEB_DATA_DIR/loopsweb.env` and deploy/loopsweb.env.example say it all:
LOOPSWEB_BIND, LOOPSWEB_WEB_WORKERS, LOOPSWEB_WEB_THREADS, LOOPSWEB_WEB_TIMEOUT. Under
systemd socket activation (deploy/loopsweb-web.socket) gunicorn listens on the socket systemd
passes instead of LOOPSWEB_BIND. Production settings are checked first
(loopsweb.production): a missing SECRET_KEY or ALLOWED_HOSTS stops here with one line.
"""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopsweb.settings")

from django.conf import settings  # noqa: E402

from loopsweb.production import problems  # noqa: E402

_found = problems()
if _found:
    for _problem in _found:
        print(f"loopsweb: {_problem}", file=sys.stderr)
    sys.exit(2)

wsgi_app = "loopsweb.wsgi:application"
bind = [settings.LOOPSWEB_BIND]
workers = settings.LOOPSWEB_WEB_WORKERS
# Threads per worker (gthread): the ops pages and the API wait on the database, not the CPU.
threads = settings.LOOPSWEB_WEB_THREADS
worker_class = "gthread"
timeout = settings.LOOPSWEB_WEB_TIMEOUT
graceful_timeout = 30
# Access log on stdout in the Apache/NCSA combined format (what log tools parse); errors
# on stderr.
accesslog = "-"
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'
errorlog = "-"
loglevel = settings.LOG_LEVEL.lower()
# A worker is replaced after this many requests (with jitter), bounding slow leaks.
max_requests = 2000
max_requests_jitter = 200
# Forwarded headers (X-Forwarded-Proto, -For) are trusted only with LOOPSWEB_BEHIND_PROXY=1,
# and then only from LOOPSWEB_PROXY_IPS (the proxy's addresses, default loopback); without it
# gunicorn trusts no one, so a client on loopback cannot claim HTTPS either.
forwarded_allow_ips = (
    ",".join(settings.LOOPSWEB_PROXY_IPS) if settings.LOOPSWEB_BEHIND_PROXY else ""
)
proc_name = "loopsweb-web"
# gunicorn answers a request line over 4094 characters with its own HTML 414; every answer
# under /api/ must be JSON, so it lets lines up to 1 MiB through (0 = its largest) and
# Django refuses a URL over 8190 characters there (routing.api.middleware, JSON 414).
limit_request_line = 0
# gunicorn 25.1+ opens a control socket in $XDG_RUNTIME_DIR or ~/.gunicorn by default: one
# path per user, which two servers on one machine would fight over. Not used here.
control_socket_disable = True
