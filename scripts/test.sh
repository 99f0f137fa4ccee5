#!/usr/bin/env bash
# `make test`: the whole suite on SQLite, then on PostgreSQL.
# PostgreSQL: PG_TEST_URL when given (.ci/run starts one), else a throwaway server started here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONDONTWRITEBYTECODE=1

work=$(mktemp -d /tmp/loopsweb-test.XXXXXX)
cleanup() { [ -n "${started_pg:-}" ] && pg_stop; rm -rf "$work"; }
trap cleanup EXIT

run_suite() {  # $1 = label; the environment selects the database
  local rc=0
  echo "=== loopsweb test suite on $1 ==="
  "$PY" -m pytest -q "${@:2}" || rc=$?
  if [ "$rc" = 5 ]; then echo "no tests collected on $1" >&2; return 1; fi
  return "$rc"
}

LOOPSWEB_DATA_DIR="$work/sqlite" DATABASE_URL="sqlite:///$work/sqlite/app.sqlite3" \
  SQLITE_TEST_NAME="$work/sqlite/test.sqlite3" run_suite SQLite "$@"

if [ -z "${PG_TEST_URL:-}" ]; then
  # shellcheck source=../.ci/pg.sh
  source .ci/pg.sh
  pg_start
  started_pg=1
fi
LOOPSWEB_DATA_DIR="$work/pg" DATABASE_URL="$PG_TEST_URL" run_suite PostgreSQL "$@"
echo "=== both suites passed (SQLite and PostgreSQL) ==="
