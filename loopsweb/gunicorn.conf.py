"""gunicorn's configuration for loopsweb: `gunicorn -c loopsweb/gunicorn.conf.py loopsweb.wsgi`
(scripts/serve.sh web does this).

Every value comes from loopsweb's settings (loopsweb/settings.py, "web server"), so the
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
# Proxies may set X-Forwarded-* (Django reads X-Forwarded-Proto only when
# LOOPSWEB_BEHIND_PROXY=1); gunicorn itself trusts them from loopback only.
forwarded_allow_ips = "127.0.0.1,::1"
proc_name = "loopsweb-web"
# gunicorn 25.1+ opens a control socket in $XDG_RUNTIME_DIR or ~/.gunicorn by default: one
# path per user, which two servers on one machine would fight over. Not used here.
control_socket_disable = True
