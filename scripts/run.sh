#!/usr/bin/env bash
# `make run`: the app on SQLite, everything one machine runs. Migrates, makes sure a staff user
# exists, then runs the web server on 127.0.0.1:8000, the main qcluster (drains, schedules,
# lease recovery; Q_WORKERS) and the run qcluster (agent runs; LOOPSWEB_RUN_WORKERS) side by
# side. Ctrl-C (or SIGTERM) stops all three.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
data_dir=${LOOPSWEB_DATA_DIR:-var}
# shellcheck source=ensure-bwrap.sh
[ "${LOOPSWEB_AGENT_SANDBOX:-bwrap}" = off ] || source scripts/ensure-bwrap.sh

# The installation's development configuration, written once: every process of this
# installation reads it (loopsweb/installation.py), so `manage.py` commands typed in another
# terminal run with the same settings and the same generated SECRET_KEY as this one.
mkdir -p "$data_dir"
if [ ! -e "$data_dir/loopsweb.env" ]; then
  (umask 077 && printf '%s\n' \
    "# loopsweb installation settings (NAME=value); the environment wins over this file." \
    "# Written by \`make run\` for development; production sets DEBUG=0 and SECRET_KEY." \
    "DEBUG=1" "LOOPSWEB_HTTPS=0" \
    "LOOPSWEB_PROJECT_ROOTS=${LOOPSWEB_PROJECT_ROOTS:-$(realpath -m "$data_dir")/projects}" \
    >"$data_dir/loopsweb.env")
  echo "loopsweb: wrote $data_dir/loopsweb.env (development settings of this installation)"
fi

# Agents run only inside LOOPSWEB_PROJECT_ROOTS: the environment's, else the one the env file
# names (read as every process reads it, loopsweb/installation.py: nothing exported here
# overrides the file), else a demo root in the data directory. The demo root gets one git
# project, so a first routed event can run.
demo_roots="$(realpath -m "$data_dir")/projects"
if [ -z "${LOOPSWEB_PROJECT_ROOTS:-}" ]; then
  LOOPSWEB_PROJECT_ROOTS=$(
    env -u LOOPSWEB_PROJECT_ROOTS "$PY" - "$data_dir/loopsweb.env" <<'EOF'
import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from loopsweb.installation import load_installation_env

try:
    load_installation_env(Path(sys.argv[1]))
except ImproperlyConfigured:
    pass  # manage.py names the bad line below
print(os.environ.get("LOOPSWEB_PROJECT_ROOTS", ""))
EOF
  )
  export LOOPSWEB_PROJECT_ROOTS="${LOOPSWEB_PROJECT_ROOTS:-$demo_roots}"
fi
if [ "$LOOPSWEB_PROJECT_ROOTS" = "$demo_roots" ]; then
  demo="$demo_roots/demo"
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
clusters=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # A qcluster finishes its running tasks on SIGTERM; give each 30 s of wall time (counted by
  # the clock, not by loop turns, which a busy machine makes slow), then make sure nothing of
  # its process group is left behind.
  local deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    alive=0
    for pid in "${clusters[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${clusters[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop INT TERM EXIT

# Each qcluster runs in its own session: a terminal Ctrl-C must not reach its worker processes
# directly (they would die mid-task and the cluster would wait for them); it gets one SIGTERM
# from stop() and shuts its workers down itself.
setsid "$PY" manage.py qcluster &
clusters+=($!)
pids+=($!)
Q_CLUSTER_NAME=loopsweb-runs setsid "$PY" manage.py qcluster &
clusters+=($!)
pids+=($!)
"$PY" manage.py runserver --noreload "127.0.0.1:${LOOPSWEB_PORT:-8000}" &
pids+=($!)
echo "loopsweb: http://127.0.0.1:${LOOPSWEB_PORT:-8000}/admin/ (Ctrl-C stops the web server and both clusters)"
wait -n "${pids[@]}" || true
