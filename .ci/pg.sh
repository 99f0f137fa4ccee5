# shellcheck shell=bash
# A throwaway PostgreSQL on loopback for the test suite. Source this file, then:
#   pg_start    installs Debian's postgresql when missing, starts a fresh cluster,
#               exports PG_TEST_URL (postgres://postgres@127.0.0.1:<port>/loopsweb)
#   pg_stop     stops exactly that cluster and removes its directory
# Root cannot run postgres, so as root the server runs as the `postgres` OS user.

pg_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/postgres" ] && { echo "$d"; return 0; }
  done
  return 1
}

pg_as() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_free_port() {
  python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

pg_start() {
  local bin
  if ! bin=$(pg_bin); then
    echo "pg: installing Debian's postgresql package" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    bin=$(pg_bin) || { echo "pg: postgresql install failed" >&2; return 1; }
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --home /nonexistent --shell /usr/sbin/nologin postgres
  fi
  PG_ROOT=$(mktemp -d /tmp/loopsweb-pg.XXXXXX)
  [ "$(id -u)" = 0 ] && chown postgres: "$PG_ROOT"
  PG_PORT=${PG_PORT:-$(pg_free_port)}
  pg_as "$bin/initdb" -D "$PG_ROOT/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  # A throwaway server: no durability (fsync, synchronous_commit, full_page_writes), and no
  # autovacuum (its workers visit each of the suite's databases, which live minutes).
  pg_as "$bin/pg_ctl" -D "$PG_ROOT/data" -l "$PG_ROOT/server.log" -w -t 60 \
    -o "-p $PG_PORT -k $PG_ROOT -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c autovacuum=off" \
    start >/dev/null
  PG_BIN=$bin
  export PG_ROOT PG_PORT PG_BIN
  export PG_TEST_URL="postgres://postgres@127.0.0.1:$PG_PORT/loopsweb"
  echo "pg: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT" >&2
}

pg_stop() {
  [ -n "${PG_ROOT:-}" ] && [ -d "$PG_ROOT/data" ] || return 0
  pg_as "$PG_BIN/pg_ctl" -D "$PG_ROOT/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$PG_ROOT"
  unset PG_ROOT
}
