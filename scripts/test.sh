#!/usr/bin/env bash
# `make test`: the whole suite on SQLite and on PostgreSQL, side by side (TEST_SERIAL=1: one
# after the other), each in parallel (pytest-xdist).
# PostgreSQL: PG_TEST_URL when given (.ci/run starts one), else a throwaway server started here.
# TEST_BACKENDS: which suites to run ("sqlite postgresql" by default; `make test-fast`: sqlite).
# TEST_WORKERS: xdist workers per suite (0 runs in this process, no xdist). Default: 3 for
# SQLite, 4 for PostgreSQL. Most slow tests wait on subprocesses, so a 2-core machine keeps
# busy with more workers than cores; but the SQLite suite spends its time computing (4 workers
# cost 7 % more CPU than 3, their processes contending for 2 cores, and ended no sooner), while
# the PostgreSQL suite's hosts and instances tests wait minutes on heartbeats and leases.
# Each worker has its own test database: pytest-django suffixes the test database's name with
# the worker id (test.sqlite3_gw0, test_loopsweb_gw0, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TEST_BACKENDS=${TEST_BACKENDS:-sqlite postgresql}
declare -A WORKERS=([sqlite]=${TEST_WORKERS:-3} [postgresql]=${TEST_WORKERS:-4})
for backend in $TEST_BACKENDS; do
  case "$backend" in sqlite | postgresql) ;; *)
    echo "test: TEST_BACKENDS names sqlite and/or postgresql, got '$backend'" >&2; exit 2 ;;
  esac
done
[ -n "${TEST_BACKENDS// /}" ] || { echo "test: TEST_BACKENDS is empty" >&2; exit 2; }
[[ "${TEST_WORKERS:-0}" =~ ^[0-9]+$ ]] || { echo "test: TEST_WORKERS must be a number, got '$TEST_WORKERS'" >&2; exit 2; }

# The ops browser test drives Debian's Chromium through its ChromeDriver (never a downloaded
# browser). Install them when missing and we can (as root); otherwise that test says how.
if { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; } && [ "$(id -u)" = 0 ] \
  && [ -z "${LOOPSWEB_SKIP_BROWSER:-}" ] && command -v apt-get >/dev/null; then
  echo "test: installing Debian's chromium and chromium-driver for the browser test" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# Every agent step runs in a bubblewrap sandbox (docs/isolation.md §7): installed when missing.
# shellcheck source=ensure-bwrap.sh
source scripts/ensure-bwrap.sh
ensure_bwrap

work=$(mktemp -d /tmp/loopsweb-test.XXXXXX)
# Bytecode: the installed packages' was compiled by pip install; loopsweb's and the tests' goes
# to their __pycache__ directories (git ignores them), written once and read by every process
# a test starts (compiling loopsweb again was about a third of a command's start-up CPU). A
# cache prefix (PYTHONPYCACHEPREFIX) would ignore pip's bytecode and compile Django and
# every package again, each run.
unset PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX
# Compiled once, here, while PostgreSQL starts and the first suite migrates its scratch
# database: the suites' workers start together and would each compile the tests and loopsweb
# at the same moment (about 3 s of CPU a process, seven workers). One collection compiles
# what they import; a failing collection shows in the suites.
LOOPSWEB_DATA_DIR="$work/warm" "$PY" -m pytest -q --collect-only -p no:cacheprovider >/dev/null 2>&1 &
warming=$!
wait_for_warming() {  # before a suite's workers start; only this shell can wait for it
  [ -n "${warming:-}" ] || return 0
  wait "$warming" || true
  warming=
}
pg_psql() { PGOPTIONS="-c client_min_messages=warning" "${PG_BIN:+$PG_BIN/}psql" -qX "${PG_TEST_URL%/*}/postgres" "$@"; }
cleanup() {
  kill "$warming" 2>/dev/null || true  # a start that failed before the suites
  [ -n "${pg_check_db:-}" ] && { pg_psql -c "DROP DATABASE IF EXISTS \"$pg_check_db\" WITH (FORCE)" || true; }
  [ -n "${started_pg:-}" ] && pg_stop; rm -rf "$work"
}
trap cleanup EXIT

run_suite() {  # $1 = label, $2 = xdist workers; the environment selects the database
  local rc=0 parallel=()
  # Tests that must not run beside each other carry an xdist_group: loadgroup keeps each group on
  # one worker and spreads the rest test by test, in the order tests/conftest.py sorts them
  # (groups first; --no-loadscope-reorder keeps that order rather than xdist's largest-first).
  [ "$2" -gt 0 ] && parallel=(-n "$2" --dist loadgroup --no-loadscope-reorder)
  # Migration safety first (lock file, models, reversibility, additivity), with the plan on a
  # scratch database of this backend: migrated, so the plan shows every migration applied.
  echo "=== check_migrations on $1 ==="
  local check_started=$SECONDS check_seconds
  SECRET_KEY=check-migrations-only DATABASE_URL="$CHECK_URL" "$PY" manage.py migrate --noinput -v0
  SECRET_KEY=check-migrations-only DATABASE_URL="$CHECK_URL" "$PY" manage.py check_migrations
  check_seconds=$((SECONDS - check_started))
  echo "=== loopsweb test suite on $1 ==="
  local started=$SECONDS
  wait_for_warming  # one after the other (TEST_SERIAL, one backend): ran beside check_migrations
  # Each suite its own temporary directories: pytest's shared default (/tmp/pytest-of-USER)
  # prunes the oldest sessions' directories, which may be the other suite's, still in use.
  "$PY" -m pytest -q "${parallel[@]}" --basetemp="$LOOPSWEB_DATA_DIR/tmp" "${@:3}" || rc=$?
  echo "=== $1: check_migrations and the suite took $((SECONDS - started + check_seconds)) s ==="
  if [ "$rc" = 5 ]; then echo "no tests collected on $1" >&2; return 1; fi
  return "$rc"
}

# Each worker's test database is a copy of the database check_migrations read, just migrated
# (LOOPSWEB_TEST_DB_TEMPLATE, tests/conftest.py): migrated once, not once per worker.
sqlite_suite() {
  CHECK_URL="sqlite:///$work/sqlite/check.sqlite3" LOOPSWEB_TEST_DB_TEMPLATE="$work/sqlite/check.sqlite3" \
  LOOPSWEB_DATA_DIR="$work/sqlite" DATABASE_URL="sqlite:///$work/sqlite/app.sqlite3" \
    SQLITE_TEST_NAME="$work/sqlite/test.sqlite3" run_suite SQLite "${WORKERS[sqlite]}" "$@"
}
postgresql_suite() {
  CHECK_URL="${PG_TEST_URL%/*}/$pg_check_db" LOOPSWEB_TEST_DB_TEMPLATE="$pg_check_db" \
  LOOPSWEB_DATA_DIR="$work/pg" DATABASE_URL="$PG_TEST_URL" run_suite PostgreSQL "${WORKERS[postgresql]}" "$@"
}

backends_run=()
for backend in sqlite postgresql; do
  [[ " $TEST_BACKENDS " == *" $backend "* ]] && backends_run+=("$backend")
done
if [[ " ${backends_run[*]} " == *" postgresql "* ]]; then
  if [ -z "${PG_TEST_URL:-}" ]; then
    # shellcheck source=../.ci/pg.sh
    source .ci/pg.sh
    pg_start
    started_pg=1
  fi
  # check_migrations' scratch database: the test database's name + _check, on the same server.
  pg_check_db="$(basename "${PG_TEST_URL%%\?*}")_check"
  pg_psql -c "DROP DATABASE IF EXISTS \"$pg_check_db\" WITH (FORCE)" -c "CREATE DATABASE \"$pg_check_db\""
fi

# Both suites side by side (TEST_SERIAL=1: one after the other). Much of each suite's time is
# waiting (schedules, heartbeats, leases, the CLIs' start-up), so on 2 cores the two together
# take little more than the longer one. Each line is prefixed with its suite's name.
if [ "${#backends_run[@]}" = 2 ] && [ "${TEST_SERIAL:-0}" != 1 ]; then
  wait_for_warming  # here: a suite's subshell cannot wait for it
  pids=()
  for backend in "${backends_run[@]}"; do
    ( "${backend}_suite" "$@" 2>&1 | sed -u "s/^/[$backend] /" ) &
    pids+=("$!")
  done
  failed=()
  for i in 0 1; do
    wait "${pids[$i]}" || failed+=("${backends_run[$i]}")
  done
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "=== the suite FAILED on ${failed[*]} (see the [${failed[0]}] lines above) ===" >&2
    exit 1
  fi
else
  for backend in "${backends_run[@]}"; do "${backend}_suite" "$@"; done
fi
if [ "${#backends_run[@]}" = 2 ]; then
  echo "=== both suites passed (SQLite and PostgreSQL) ==="
else
  echo "=== the suite passed on ${backends_run[*]} ==="
fi
