#!/usr/bin/env bash
# `make serve`: loopsweb as it runs in production, on one machine.
#
#   scripts/serve.sh          migrate, collectstatic, sync schedules, then gunicorn, the main
#                             qcluster and the run qcluster side by side; Ctrl-C (or SIGTERM)
#                             stops all three, and so does any one of them exiting.
#   scripts/serve.sh setup    only the installation's one-off steps (migrate, sync schedules):
#                             once per deploy, on one machine, before the processes below.
#   scripts/serve.sh web      collectstatic (this machine's copy), then only     } one process
#                             gunicorn (loopsweb/gunicorn.conf.py)               }
#   scripts/serve.sh cluster  only the main qcluster (drains, schedules, recovery) } each, for
#   scripts/serve.sh runs     only the run qcluster (agent runs)                 } systemd or
#                                                                                 a container
#   scripts/serve.sh health   manage.py health once: the installation's health (the database,
#                             both clusters), exit 1 when unhealthy; for monitoring
#                             (deploy/loopsweb-health.timer). Load balancers ask GET /healthz.
# Production settings: DEBUG is forced off, so SECRET_KEY and ALLOWED_HOSTS must be set (in
# the environment or $LOOPSWEB_DATA_DIR/loopsweb.env; deploy/loopsweb.env.example lists every
# setting). HTTPS settings are on unless LOOPSWEB_HTTPS=0 (plain HTTP on loopback, tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mode=${1:-all}
case "$mode" in
  all | setup | web | cluster | runs | health) ;;
  *)
    echo "usage: scripts/serve.sh [all|setup|web|cluster|runs|health]" >&2
    exit 2
    ;;
esac

export DEBUG=0
export DJANGO_SETTINGS_MODULE=loopsweb.settings
# One line per missing setting (SECRET_KEY, ALLOWED_HOSTS, a bad value) instead of a traceback.
"$PY" -m loopsweb.production

setup() {
  "$PY" manage.py migrate --no-input -v0
  "$PY" manage.py sync_schedules
}
# Static files live on each web machine (STATIC_ROOT), so every web server collects its own.
collectstatic() { "$PY" manage.py collectstatic --no-input -v0; }

# Each process replaces the shell (exec) when started alone, so systemd or a container runtime
# signals it directly: gunicorn stops gracefully on SIGTERM, a qcluster finishes its tasks.
web() {
  collectstatic
  exec "$PY" -m gunicorn --config loopsweb/gunicorn.conf.py
}
cluster() { exec "$PY" manage.py qcluster; }
runs() { Q_CLUSTER_NAME=loopsweb-runs exec "$PY" manage.py qcluster; }

case "$mode" in
  setup) setup; exit 0 ;;
  web) web ;;
  cluster) cluster ;;
  runs) runs ;;
  health) exec "$PY" manage.py health ;;
esac

setup
collectstatic

pids=()
clusters=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # A qcluster finishes its running tasks on SIGTERM; give each a bounded time, then make
  # sure nothing of its process group is left behind.
  for _ in $(seq 1 300); do
    alive=0
    for pid in "${clusters[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${clusters[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop INT TERM EXIT

# As in scripts/run.sh: each qcluster runs in its own session, so a terminal Ctrl-C does not
# reach its workers mid-task; it gets one SIGTERM from stop() and shuts its workers down.
# gunicorn stays in this group: its master stops its workers itself on the Ctrl-C.
setsid "$PY" manage.py qcluster &
clusters+=($!)
pids+=($!)
Q_CLUSTER_NAME=loopsweb-runs setsid "$PY" manage.py qcluster &
clusters+=($!)
pids+=($!)
"$PY" -m gunicorn --config loopsweb/gunicorn.conf.py &
pids+=($!)
echo "loopsweb: gunicorn (LOOPSWEB_BIND), the main cluster and the run cluster started (Ctrl-C stops all)"
wait -n "${pids[@]}" || true
