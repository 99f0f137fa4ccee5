#!/usr/bin/env bash
# The suite under load (issue 37): `make test` on each database beside two CPU-bound processes,
# from a fresh clone of this checkout's HEAD, so nothing of this checkout (its .venv, its
# caches, its uncommitted files) takes part.
#
#   tests/bench/suite_under_load.sh            SQLite 3 times in a row, then PostgreSQL once
#   SQLITE_RUNS=1 PG_RUNS=0 tests/bench/suite_under_load.sh
#
# The two busy processes (`python3 -c 'while True: pass'`) run from before the first suite to
# after the last. After each run: its result line, its wall time, the load average, whether
# `git status --porcelain` of the clone is clean, and whether a `manage.py` process of the
# clone is left running. The rows are printed as a markdown table (tests/bench/RESULTS.md,
# section 11) and each run's whole output is kept in the clone's directory, named at the end.
# Exits non-zero when a run failed, left the clone changed or left a process behind.
set -euo pipefail
cd "$(dirname "$0")/../.."
SQLITE_RUNS=${SQLITE_RUNS:-3}
PG_RUNS=${PG_RUNS:-1}
for n in "$SQLITE_RUNS" "$PG_RUNS"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "suite_under_load: SQLITE_RUNS and PG_RUNS are counts, got '$n'" >&2; exit 2; }
done

root=$(mktemp -d /tmp/loopsweb-under-load.XXXXXX)
clone="$root/loopsweb"
git clone -q --no-local . "$clone"
commit=$(git -C "$clone" rev-parse --short HEAD)
echo "suite_under_load: a fresh clone of $commit in $clone; installing (not timed)" >&2
make -C "$clone" -s install >/dev/null

busy=()
stop_busy() { for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_busy EXIT
for _ in 1 2; do
  python3 -c 'while True: pass' &
  busy+=("$!")
done

rows=()
failed=0
run() {  # $1 = backend, $2 = run number
  local log="$root/$1-$2.log" started=$SECONDS rc=0 result status left
  echo "suite_under_load: $1 run $2 of ${3} (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  TEST_BACKENDS=$1 make -C "$clone" -s test >"$log" 2>&1 || rc=$?
  local wall=$((SECONDS - started))
  result=$(grep -ho "loopsweb suite on [a-z]*: .*" "$log" | tail -1 || true)
  [ -n "$result" ] || result="no result line (exit $rc)"
  if [ -z "$(git -C "$clone" status --porcelain --untracked-files=all)" ]; then status=clean; else status="**changed**"; fi
  if pgrep -f "$clone/manage.py" >/dev/null; then left="**yes**"; else left=no; fi
  rows+=("| $1 $2 | ${result#loopsweb suite on *: } | $wall s | $(cut -d' ' -f1-3 /proc/loadavg) | $status | $left |")
  [ "$rc" = 0 ] && [ "$status" = clean ] && [ "$left" = no ] || failed=1
  echo "suite_under_load: $1 run $2: $result, $wall s, exit $rc" >&2
}
for i in $(seq 1 "$SQLITE_RUNS"); do run sqlite "$i" "$SQLITE_RUNS"; done
for i in $(seq 1 "$PG_RUNS"); do run postgresql "$i" "$PG_RUNS"; done
stop_busy

echo
echo "Beside two \`python3 -c 'while True: pass'\`, a fresh clone of \`$commit\`, $(nproc) cores:"
echo
echo "| run | result | wall | load average (1, 5, 15 min) after | \`git status --porcelain\` | a \`manage.py\` left running |"
echo "|---|---|---:|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "suite_under_load: each run's output is in $root" >&2
exit "$failed"
