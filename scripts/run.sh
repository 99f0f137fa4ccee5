#!/usr/bin/env bash
# `make run`: the app on SQLite. Migrates, makes sure a staff user exists, then runs the web
# server on 127.0.0.1:8000 and a qcluster side by side. Ctrl-C (or SIGTERM) stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export DEBUG=${DEBUG:-1}
export LOOPSWEB_HTTPS=${LOOPSWEB_HTTPS:-0}
# One key for the web server and the qcluster: django-q2 signs the tasks the web server
# enqueues (an event routed through the API starts a run) and the cluster checks them.
if [ -z "${SECRET_KEY:-}" ]; then
  SECRET_KEY=$("$PY" -c 'import secrets; print("dev-" + secrets.token_urlsafe(40))')
  export SECRET_KEY
fi

# Agents run only inside LOOPSWEB_PROJECT_ROOTS. Unless one is set, make run uses a demo root
# in the data directory with one git project in it, so a first routed event can run.
if [ -z "${LOOPSWEB_PROJECT_ROOTS:-}" ]; then
  data_dir=$(realpath -m "${LOOPSWEB_DATA_DIR:-var}")
  export LOOPSWEB_PROJECT_ROOTS="$data_dir/projects"
  demo="$LOOPSWEB_PROJECT_ROOTS/demo"
  mkdir -p "$demo"
  if command -v git >/dev/null && [ ! -e "$demo/.git" ]; then
    git -c init.defaultBranch=main -C "$demo" init -q
    printf 'A demo project for loopsweb agents.\n' > "$demo/README"
    git -C "$demo" add README
    git -C "$demo" -c user.name=loopsweb -c user.email=loopsweb@localhost \
      commit -q -m "demo project"
  fi
  echo "loopsweb: demo project root $LOOPSWEB_PROJECT_ROOTS (project: $demo)"
fi

"$PY" manage.py migrate --no-input -v0
"$PY" manage.py ensure_staff_user
"$PY" manage.py sync_schedules

pids=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # qcluster finishes its running tasks on SIGTERM; give it a bounded time, then make sure
  # nothing of its process group is left behind.
  for _ in $(seq 1 300); do
    kill -0 "$qcluster" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$qcluster" 2>/dev/null || true
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop INT TERM EXIT

# qcluster runs in its own session: a terminal Ctrl-C must not reach its worker processes
# directly (they would die mid-task and the cluster would wait for them); it gets one SIGTERM
# from stop() and shuts its workers down itself.
setsid "$PY" manage.py qcluster &
qcluster=$!
pids+=("$qcluster")
"$PY" manage.py runserver --noreload "127.0.0.1:${LOOPSWEB_PORT:-8000}" &
pids+=($!)
echo "loopsweb: http://127.0.0.1:${LOOPSWEB_PORT:-8000}/admin/ (Ctrl-C stops the web server and the qcluster)"
wait -n "${pids[@]}" || true
