"""What every benchmark shares: a throwaway database, Django set up on it, and the report.

A benchmark process calls `start(name)` before importing any model. It creates a database
that nothing else uses, points DATABASE_URL at it, sets Django up with production-like
settings (DEBUG off, so no query log grows in memory), migrates, and drops the database when
the process ends:
  - SQLite (DATABASE_URL unset or sqlite://): a file in a fresh temporary directory.
  - PostgreSQL (DATABASE_URL=postgres://…): `CREATE DATABASE bench_<name>_<pid>` on that
    server, dropped WITH (FORCE) at exit. No other database on the server is touched.

Child processes a benchmark spawns (racing drainers, the memory probe) call `attach()`
instead: they inherit the throwaway DATABASE_URL and never create or drop anything.

Figures are reported, never asserted: each `Figure` carries its target and whether it was
met, the table is printed and the JSON lands in tests/bench/results/<name>.json.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The DATABASE_URL the operator gave `make bench` (the server to create throwaway dbs on).
SERVER_URL_ENV = "BENCH_SERVER_URL"
SCALE = os.environ.get("BENCH_SCALE", "full").strip().lower() or "full"
if SCALE not in ("full", "small"):
    raise SystemExit(f"BENCH_SCALE must be full or small, got {SCALE!r}")


def scaled(full: int, small: int | None = None) -> int:
    """`full` at full scale; BENCH_SCALE=small divides by 100 unless told otherwise."""
    if SCALE == "full":
        return full
    return small if small is not None else max(1, full // 100)


# --- the throwaway database -------------------------------------------------------------------


def server_url() -> str:
    return os.environ.get(SERVER_URL_ENV) or os.environ.get("DATABASE_URL", "").strip()


def is_postgres(url: str) -> bool:
    return url.startswith(("postgres://", "postgresql://"))


def _with_db_name(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _pg_admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


# `make bench` seeds the 1,000,000-item ledger once: the admission benchmark hands its
# database over (a rename, O(1)) and the pages benchmark adopts it as its own throwaway
# database, instead of spending minutes seeding the same history again. The orchestrator
# sets BENCH_HANDOVER to a token and removes whatever is left under it at the end.
HANDOVER_ENV = "BENCH_HANDOVER"


def handover_sqlite_path(token: str) -> Path:
    return Path(tempfile.gettempdir()) / f"loopsweb-bench-{token}.sqlite3"


def handover_pg_name(token: str) -> str:
    return f"bench_{token}"


def discard_handover(token: str) -> None:
    """Remove a handed-over database nobody adopted (the orchestrator's clean-up)."""
    base = server_url()
    if is_postgres(base):
        _pg_admin(
            base, f'DROP DATABASE IF EXISTS "{handover_pg_name(token)}" WITH (FORCE)'
        )
    for suffix in ("", "-wal", "-shm"):
        Path(str(handover_sqlite_path(token)) + suffix).unlink(missing_ok=True)


@dataclass
class BenchDatabase:
    name: str
    vendor: str
    url: str
    workdir: Path
    adopted: bool = False
    _dropped: bool = False

    @property
    def sqlite_path(self) -> Path:
        return self.workdir / f"{self.name}.sqlite3"

    @property
    def projects_dir(self) -> Path:
        """A project root of this benchmark's own, for projects agents really run in."""
        return self.workdir / "projects"

    def drop(self) -> None:
        if self._dropped:
            return
        self._dropped = True
        _close_django_connections()
        if self.vendor == "postgresql":
            _pg_admin(
                server_url(), f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'
            )
        shutil.rmtree(self.workdir, ignore_errors=True)

    def hand_over(self) -> bool:
        """Keep this database for the pages benchmark (when `make bench` asked for it)."""
        token = os.environ.get(HANDOVER_ENV)
        if not token or self._dropped:
            return False
        if self.vendor == "sqlite":
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            _close_django_connections()
            shutil.move(self.sqlite_path, handover_sqlite_path(token))
        else:
            _close_django_connections()
            _pg_admin(
                server_url(),
                f'ALTER DATABASE "{self.name}" RENAME TO "{handover_pg_name(token)}"',
            )
        self._dropped = True
        shutil.rmtree(self.workdir, ignore_errors=True)
        return True


def _close_django_connections() -> None:
    try:
        from django.db import connections

        connections.close_all()
    except Exception:  # Django may not be set up yet; nothing to close then
        pass


def _adopt(db: BenchDatabase) -> bool:
    """Take over a handed-over database under this benchmark's own name, if there is one."""
    token = os.environ.get(HANDOVER_ENV)
    if not token:
        return False
    if db.vendor == "sqlite":
        source = handover_sqlite_path(token)
        if not source.exists():
            return False
        shutil.move(source, db.sqlite_path)
        return True
    import psycopg

    with psycopg.connect(server_url(), autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [handover_pg_name(token)]
        ).fetchone()
        if not found:
            return False
        conn.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')
        conn.execute(
            f'ALTER DATABASE "{handover_pg_name(token)}" RENAME TO "{db.name}"'
        )
    return True


def _sigterm_to_exit(signum: int, frame: Any) -> None:
    # Turn SIGTERM into SystemExit so `finally`/atexit drop the throwaway database.
    raise SystemExit(128 + signum)


def start(name: str, *, adopt: bool = False) -> BenchDatabase:
    """Create this benchmark's own database, set Django up on it and migrate.

    With `adopt`, a database handed over by an earlier benchmark of the same `make bench`
    run becomes this one's (see HANDOVER_ENV); `db.adopted` says whether that happened.
    """
    base = server_url()
    os.environ[SERVER_URL_ENV] = base
    workdir = Path(tempfile.mkdtemp(prefix=f"loopsweb-bench-{name}-"))
    db_name = f"bench_{name}_{os.getpid()}"
    if is_postgres(base):
        db = BenchDatabase(db_name, "postgresql", _with_db_name(base, db_name), workdir)
    elif base and not base.startswith("sqlite://"):
        raise SystemExit(f"DATABASE_URL must be sqlite:// or postgres://, got {base!r}")
    else:
        db = BenchDatabase(db_name, "sqlite", "", workdir)
        db.url = f"sqlite:///{db.sqlite_path}"
    atexit.register(db.drop)
    db.adopted = adopt and _adopt(db)
    if db.vendor == "postgresql" and not db.adopted:
        _pg_admin(base, f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        _pg_admin(base, f'CREATE DATABASE "{db_name}"')
    signal.signal(signal.SIGTERM, _sigterm_to_exit)
    db.projects_dir.mkdir()
    configure_environment(db.url, workdir)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    return db


def configure_environment(url: str, data_dir: Path) -> None:
    """Environment for loopsweb.settings: production-like (DEBUG off, real SECRET_KEY).

    DEBUG stays off so Django keeps no query log (memory and time would grow with every
    query); HTTPS redirects are off and `testserver` is allowed so the test Client can render
    pages; INFO logs (one per django-q2 enqueue) would drown the tables.
    """
    os.environ["DATABASE_URL"] = url
    os.environ["LOOPSWEB_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_urlsafe(40))
    os.environ["DEBUG"] = "0"
    os.environ["LOOPSWEB_HTTPS"] = "0"
    os.environ["ALLOWED_HOSTS"] = "testserver,127.0.0.1,localhost"
    os.environ["LOG_LEVEL"] = "WARNING"
    # The benchmarks' projects are fake paths under /srv (never created, never run), or real
    # directories under the benchmark's own projects root (BenchDatabase.projects_dir).
    os.environ["LOOPSWEB_PROJECT_ROOTS"] = f"/srv,{data_dir / 'projects'}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "loopsweb.settings"


def attach() -> None:
    """In a child process: set Django up on the parent's throwaway database (no migrate)."""
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "loopsweb.settings"
    django.setup()


_child_cwd: Path | None = None


def child_cwd() -> Path:
    """The working directory of the processes a benchmark starts: a temporary directory,
    never the checkout (a relative path or an agent's file would land there; see
    tests.processes.scratch_cwd, which this module cannot import before Django is set up).
    Removed at exit."""
    global _child_cwd
    if _child_cwd is None or not _child_cwd.is_dir():
        _child_cwd = Path(tempfile.mkdtemp(prefix="loopsweb-bench-cwd-"))
        atexit.register(shutil.rmtree, _child_cwd, True)
    return _child_cwd


def child_env() -> dict[str, str]:
    """Environment for a child process of a benchmark (it inherits the throwaway DB)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# --- numbers ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 500 samples is the 495th smallest)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(min(rank, len(ordered))) - 1]


def median(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


# --- the report -------------------------------------------------------------------------------


@dataclass
class Figure:
    """One reported number with its target; `met` is None when there is no target."""

    name: str
    value: float | int | str
    unit: str = ""
    target: str = ""
    met: bool | None = None

    def verdict(self) -> str:
        return {True: "met", False: "MISSED", None: "-"}[self.met]


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Any]]


@dataclass
class Report:
    name: str
    title: str
    vendor: str
    scale: str = SCALE
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def figure(
        self,
        name: str,
        value: float | int | str,
        unit: str = "",
        target: str = "",
        met: bool | None = None,
    ) -> Figure:
        fig = Figure(name, value, unit, target, met)
        self.figures.append(fig)
        return fig

    def table(self, title: str, headers: list[str], rows: Iterable[list[Any]]) -> None:
        self.tables.append(Table(title, headers, [list(r) for r in rows]))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self) -> Path:
        """Print every table and figure, then write results/<name>.json."""
        elapsed = time.time() - self.started
        print()
        print(
            f"== {self.title} [{self.vendor}, scale={self.scale}, {elapsed:.0f} s] =="
        )
        for table in self.tables:
            print_table(table.title, table.headers, table.rows)
        print_table(
            "figures",
            ["figure", "value", "target", "result"],
            [
                [f.name, format_value(f.value, f.unit), f.target or "-", f.verdict()]
                for f in self.figures
            ],
        )
        for text in self.notes:
            print(f"  note: {text}")
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{self.name}.json"
        payload = {
            "benchmark": self.name,
            "title": self.title,
            "vendor": self.vendor,
            "scale": self.scale,
            "elapsed_s": round(elapsed, 1),
            "figures": [asdict(f) for f in self.figures],
            "tables": [asdict(t) for t in self.tables],
            "notes": self.notes,
            "data": self.data,
            "machine": machine_info(self.vendor),
        }
        path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"  results: {path.relative_to(ROOT)}")
        sys.stdout.flush()
        return path


def format_value(value: float | int | str, unit: str = "") -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            text = "n/a"
        elif abs(value) >= 100:
            text = f"{value:,.0f}"
        elif abs(value) >= 10:
            text = f"{value:.1f}"
        else:
            text = f"{value:.2f}"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def print_table(title: str, headers: list[str], rows: list[list[Any]]) -> None:
    cells = [
        [format_value(c) if not isinstance(c, str) else c for c in r] for r in rows
    ]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    print(f"\n  {title}")
    line = "  " + "  ".join(h.ljust(widths[i]) for i, h in enumerate(headers))
    print(line)
    print("  " + "  ".join("-" * w for w in widths))
    for row in cells:
        print(
            "  "
            + "  ".join(
                cell.rjust(widths[i]) if _numeric(cell) else cell.ljust(widths[i])
                for i, cell in enumerate(row)
            )
        )


def _numeric(text: str) -> bool:
    head = text.split(" ")[0].replace(",", "").replace(".", "").replace("-", "")
    return head.isdigit()


# --- the machine ------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return float("nan")


def other_busy_processes(limit: int = 8) -> list[str]:
    """Processes (not ours) using CPU right now: the shared-machine caveat in RESULTS.md."""
    try:
        out = subprocess.run(
            ["ps", "-eo", "pid,ppid,pcpu,comm", "--sort=-pcpu", "--no-headers"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    mine = {os.getpid(), os.getppid()}
    busy = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4:
            continue
        pid, ppid, pcpu, comm = int(parts[0]), int(parts[1]), float(parts[2]), parts[3]
        if pid in mine or ppid in mine or pcpu < 5.0 or comm == "ps":
            continue
        busy.append(f"{comm} ({pcpu:.0f}% cpu)")
        if len(busy) >= limit:
            break
    return busy


def machine_info(vendor: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "ram_gib": _mem_total_gib(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "other_busy_processes": other_busy_processes(),
    }
    if vendor == "postgresql":
        try:
            import psycopg

            with psycopg.connect(server_url(), autocommit=True) as conn:
                info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
        except Exception as exc:  # report, never fail a benchmark over a version string
            info["postgresql"] = f"unknown ({exc})"
    try:
        import django

        info["django"] = django.get_version()
    except ImportError:
        pass
    return info


def main(name: str, run: Callable[[BenchDatabase], None]) -> None:
    """A benchmark's entry point: `run` on a throwaway database of its own, dropped after."""
    db = start(name)
    try:
        run(db)
    finally:
        db.drop()


def run_child(argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `python -m …` as a child with the benchmark's environment (and database)."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=child_cwd(),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- clusters the run benchmarks start ------------------------------------------------------


def start_qcluster(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`manage.py qcluster` in its own session with `env`, its output in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "qcluster"],
            cwd=child_cwd(),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, up to a minute for a clean stop, then SIGKILL whatever of the group is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    """The first truthy value of `condition()`, polled every 0.2 s; SystemExit after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")
