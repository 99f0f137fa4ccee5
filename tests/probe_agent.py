#!/usr/bin/env python3
"""A probing agent stand-in: what a step steered by someone else's text tries to reach
outside its run (docs/isolation.md §7). Standard library only; accepts any provider's argv.

Every step writes `probe-work-<step>.txt` in its working directory (its work, which must end
on the run's branch). The worker step then probes, one line each on stdout,
`PROBE <kind> <target>: blocked (<why>)` or `PROBE <kind> <target>: REACHED (<what>)`:

- `read` / `list` / `write`: each path of `PROBE_READ`, `PROBE_LIST`, `PROBE_WRITE`
  (comma-separated; a write creates `probe-<pid>` in a directory, or appends to a file);
- `environ`: every `/proc/*/environ` it can read, for `SECRET_KEY` or `DATABASE_URL`;
- `process`: every `/proc/*/cmdline` naming `manage.py` (a loopsweb process it could signal or
  trace), and `PROBE_SIGNAL` (a loopsweb process's host pid: signal 0 and `PTRACE_ATTACH`);
- `connect`: each `host:port` of `PROBE_CONNECT` (a loopback service that is no endpoint);
- `url`: each URL of `PROBE_URL`, fetched as a CLI would (through `HTTPS_PROXY` when set);
- `daemon`: a double-forked `setsid` process whose argv carries `PROBE_MARK`, left running
  after the probe kills its own parent and the sandbox's first process (the step guard);
  the test looks for the mark in the host's /proc once the step has ended.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time


def _line(kind: str, target: str, reached: bool, detail: str) -> None:
    verdict = "REACHED" if reached else "blocked"
    print(f"PROBE {kind} {target}: {verdict} ({detail})", flush=True)


def _list(name: str) -> list[str]:
    return [part for part in os.environ.get(name, "").split(",") if part]


def probe_files() -> None:
    for path in _list("PROBE_READ"):
        try:
            with open(path, "rb") as handle:
                _line("read", path, True, f"{len(handle.read(64))} bytes")
        except OSError as exc:
            _line("read", path, False, exc.strerror or str(exc))
    for path in _list("PROBE_LIST"):
        try:
            _line("list", path, True, ", ".join(sorted(os.listdir(path))[:5]))
        except OSError as exc:
            _line("list", path, False, exc.strerror or str(exc))
    for path in _list("PROBE_WRITE"):
        target = (
            os.path.join(path, f"probe-{os.getpid()}") if os.path.isdir(path) else path
        )
        try:
            with open(target, "a") as handle:
                handle.write("written by the probing agent\n")
            _line("write", path, True, target)
        except OSError as exc:
            _line("write", path, False, exc.strerror or str(exc))


def probe_processes() -> None:
    secrets_seen, loopsweb = [], []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
            if b"SECRET_KEY=" in environ or b"DATABASE_URL=" in environ:
                secrets_seen.append(name)
        except OSError:
            pass
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                if b"manage.py" in handle.read():
                    loopsweb.append(name)
        except OSError:
            pass
    _line("environ", "/proc/*/environ", bool(secrets_seen), f"pids {secrets_seen}")
    _line("process", "/proc/*/cmdline", bool(loopsweb), f"loopsweb pids {loopsweb}")
    pid = int(os.environ.get("PROBE_SIGNAL") or 0)
    if pid:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                theirs = b"manage.py" in handle.read()
        except OSError:
            theirs = False
        try:
            os.kill(pid, 0)  # a host pid: a sandbox's own pids are small
            _line("signal", str(pid), theirs or pid > 100, "signal 0 delivered")
        except OSError as exc:
            _line("signal", str(pid), False, exc.strerror or str(exc))
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
            libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
            _line("ptrace", str(pid), theirs or pid > 100, "attached")
        else:
            _line("ptrace", str(pid), False, os.strerror(ctypes.get_errno()))


def probe_network() -> None:
    import urllib.request

    for url in _list("PROBE_URL"):  # through the sandbox's proxy, if it has one
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                _line("url", url, True, f"HTTP {answer.status}")
        except OSError as exc:
            _line("url", url, False, str(exc))
    for target in _list("PROBE_CONNECT"):
        host, _, port = target.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                _line("connect", target, True, "connected")
        except OSError as exc:
            _line("connect", target, False, exc.strerror or str(exc))


def probe_daemon() -> None:
    mark = os.environ.get("PROBE_MARK")
    if not mark:
        return
    code = "import time; time.sleep(60)"
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", code, mark])
        os._exit(0)
    time.sleep(0.3)
    for pid in (
        1,
        os.getppid(),
    ):  # the guard (the namespace's first process), the parent
        try:
            os.kill(pid, signal.SIGKILL)
            _line("daemon", f"kill {pid}", False, "signal sent")
        except OSError as exc:
            _line("daemon", f"kill {pid}", False, exc.strerror or str(exc))


def main() -> None:
    step = os.environ.get("LOOPSWEB_STEP_ID", "step")
    with open(f"probe-work-{step}.txt", "w") as handle:
        handle.write(f"work of step {step}\n")
    print(f"probing agent in {os.getcwd()} as uid {os.getuid()}", flush=True)
    if step == "worker":
        probe_files()
        probe_processes()
        probe_network()
        probe_daemon()
    subprocess.run(["git", "status", "--short"], check=False)


if __name__ == "__main__":
    main()
