"""Process supervision: a step runs as its own process group, and nothing of it outlives
the step unrecorded.

- `run_process`: the step runs under the step guard (agents.stepguard, its own process
  group, a child subreaper), so everything it spawns stays below the guard, even a process
  that calls `setsid`, and is ended when the step ends (the count is `ProcessResult.ended`);
  bounded stdout/stderr tails; `timeoutMs` and `idleTimeoutMs`
  enforced by killing the group (SIGTERM, then SIGKILL after the grace period); the run's
  lease renewed through `keep_alive` about three times per lease; when the step's process
  exits, anything it left running in its group is killed.
- in a sandbox (`Invocation.sandbox`, runs.sandbox): bwrap runs the guard as the first
  process of the step's namespaces, with the egress relay's outside half (`EgressRelay`,
  threads of this process) beside it; the guard is signalled by pid (it is bwrap's child in
  a session of its own) and reports the step's wait status, which bwrap cannot pass on.
- A group a step left behind when the ledger ended it (a cancel, a lease recovery) is the
  record's to end: ledger.reaper.

No database writes here: the runner records what happened through the services.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agents import stepguard
from agents.egress import Relay, start_outside
from runs.providers import Invocation
from runs.sandbox import INSIDE_DIR, guard_python

STEP_SPAWN_FAILED = "step could not be started: {error}"
STEP_GUARD = stepguard.__file__
# With no grace, the guard still gets this long to kill what left its group (stepguard, 5).
_GUARD_SWEEP_SECONDS = 0.2

# How long output pipes may stay open after the step's process exited (a grandchild holding
# them) before the rest of the group is killed.
_PIPE_DRAIN_SECONDS = 0.5
_SELECT_SECONDS = 0.1
_READ_BYTES = 65536
_STOP_CHECK_SECONDS = 0.5
# Of a very long output line, `on_line` sees the start (what tells an event's kind).
_LINE_BYTES = 65536


# --- a step's process -------------------------------------------------------------------------


class _Tail:
    """The last `limit` bytes of a stream, and how many earlier bytes were dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        self.buffer += data
        excess = len(self.buffer) - self.limit
        if excess > 0:
            del self.buffer[:excess]
            self.dropped += excess

    def text(self) -> str:
        body = self.buffer.decode("utf-8", "replace")
        if self.dropped:
            return f"[... {self.dropped} earlier bytes dropped ...]\n{body}"
        return body


class _Lines:
    """Splits a stream's data into complete lines for `on_line(stream, line)`; a line longer
    than `_LINE_BYTES` is handed on as its start."""

    def __init__(self, stream: str, on_line: Callable[[str, str], bool]) -> None:
        self.stream = stream
        self.on_line = on_line
        self.partial = bytearray()

    def feed(self, data: bytes) -> bool:
        """True when a line completed by `data` shows progress."""
        progress = False
        *complete, rest = data.split(b"\n")
        for piece in complete:
            self.partial += piece[: max(0, _LINE_BYTES - len(self.partial))]
            line = self.partial.decode("utf-8", "replace")
            self.partial.clear()
            progress = self.on_line(self.stream, line) or progress
        self.partial += rest[: max(0, _LINE_BYTES - len(self.partial))]
        return progress


@dataclass(frozen=True)
class ProcessResult:
    pid: int | None
    exit_code: int | None
    signal_name: str | None
    stdout: str
    stderr: str
    duration_ms: int
    timeout: str | None = None  # "total", "idle" or "deadline"
    lost: bool = False
    stopped: str | None = None  # why `stop_when` stopped the step
    spawn_error: str | None = None
    ended: int = 0  # processes the step left that the guard ended (agents.stepguard)
    # host:port -> connections the sandbox's egress relay refused (agents.egress)
    egress_refused: dict[str, int] | None = None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


def kill_process_group(
    proc: subprocess.Popen[bytes], grace_seconds: float, *, sandboxed: bool = False
) -> None:
    """SIGTERM the process group, wait up to `grace_seconds`, then SIGKILL what is left.

    A sandboxed step's guard is bwrap's child in a session of its own, the first process of
    the step's PID namespace (runs.sandbox): it is signalled by pid, and its SIGKILL ends
    the whole namespace."""
    pgid = proc.pid  # start_new_session: the step leads its own group
    guards = _children(proc.pid) if sandboxed else []
    for pid in guards:
        _signal_pid(pid, signal.SIGTERM)
    try:
        os.killpg(pgid, 0 if sandboxed else signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + max(grace_seconds, _GUARD_SWEEP_SECONDS)
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in guards:
        _signal_pid(pid, signal.SIGKILL)
    try:
        # Also reaches grandchildren that outlived a leader which obeyed SIGTERM.
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _signal_pid(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def run_process(
    *,
    invocation: Invocation,
    timeout_seconds: float | None,
    idle_timeout_seconds: float | None,
    tail_bytes: int,
    grace_seconds: float,
    on_spawn: Callable[[int], None],
    keep_alive: Callable[[], bool],
    keep_alive_every: float,
    deadline: float | None = None,
    on_output: Callable[[str, str], None] | None = None,
    output_every: float = 5.0,
    stop_when: Callable[[str, str], str | None] | None = None,
    on_line: Callable[[str, str], bool] | None = None,
    on_quiet: Callable[[str], None] | None = None,
    stop_grace_seconds: float | None = None,
) -> ProcessResult:
    """Run one step's process to the end; never raises for the process's own failures.

    `keep_alive` (the lease renewal) is called every `keep_alive_every` seconds while the
    process lives; False means the run is no longer ours and the group is killed.
    `deadline` (a `time.monotonic()` value) ends the step like a timeout (`"deadline"`).
    `on_output(stdout, stderr)` receives the tails while the step runs: at most every
    `output_every` seconds and only when there is output it has not seen, so a step that ends
    within `output_every` is never flushed. `stop_when(stdout, stderr)`, called when new output
    arrived (at most every `_STOP_CHECK_SECONDS`), returns a reason to stop the step now;
    such a stop gives the group `stop_grace_seconds` (None: `grace_seconds`) before SIGKILL.
    `on_line(stream, line)` ("stdout" or "stderr") sees each complete line as it arrives and
    says whether it shows progress; with it, the idle limit counts from the last line that
    did (an agent that only retries or logs errors is idle), without it from any output.
    `on_quiet(stdout)` is called every `output_every` seconds in which nothing was flushed:
    what a step writes elsewhere (codex's rollout file) changes while its output does not.
    """
    started = time.monotonic()
    box = invocation.sandbox
    relay: EgressRelay | None = None
    report_read, report_write = os.pipe()
    try:
        argv = guarded_argv(report_write, grace_seconds, invocation.argv)
        env = invocation.env
        if box is not None:
            relay = EgressRelay.start(box.rules)
            argv = [
                *box.bwrap_argv(relay.socket_dir, invocation.cwd),
                *inside_guard_argv(report_write, grace_seconds, box.egress_spec()),
                *box.command(invocation.argv),
            ]
            env = box.environment(env)
        proc = subprocess.Popen(
            argv,
            cwd=invocation.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=(report_write,),
        )
    except (OSError, ValueError) as exc:
        os.close(report_read)
        if relay is not None:
            relay.stop()
        return _not_started(STEP_SPAWN_FAILED.format(error=exc))
    finally:
        os.close(report_write)
    sandboxed = box is not None
    stop_grace = grace_seconds if stop_grace_seconds is None else stop_grace_seconds
    out, err = _Tail(tail_bytes), _Tail(tail_bytes)
    timeout: str | None = None
    lost = False
    try:
        on_spawn(proc.pid)
        selector = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        lines = {
            id(tail): _Lines(name, on_line)
            for tail, name in ((out, "stdout"), (err, "stderr"))
            if on_line is not None
        }
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        last_output = last_progress = started
        next_keep_alive = started + keep_alive_every
        next_flush = started + output_every
        next_stop_check = started
        flushed_at = checked_at = started  # output up to here was seen
        exited_at: float | None = None
        stopped: str | None = None
        while True:
            if selector.get_map():
                for key, _ in selector.select(_SELECT_SECONDS):
                    data = os.read(key.fd, _READ_BYTES)
                    if data:
                        key.data.add(data)
                        last_output = time.monotonic()
                        reader = lines.get(id(key.data))
                        if reader is None or reader.feed(data):
                            last_progress = last_output
                    else:
                        selector.unregister(key.fileobj)
            else:
                # Both pipes closed but the process lives on: keep enforcing the limits,
                # and go on the moment it exits (a sandbox's bwrap outlives its pipes by
                # a few milliseconds: a plain sleep cost every such step 100 ms).
                try:
                    proc.wait(timeout=_SELECT_SECONDS)
                except subprocess.TimeoutExpired:
                    pass
            now = time.monotonic()
            if proc.poll() is not None:
                if not selector.get_map():
                    break
                # Exited; pipes still open means a grandchild holds them: give it a moment to
                # flush, then end the whole group so the step cannot leave anything behind.
                exited_at = exited_at or now
                if now - exited_at > _PIPE_DRAIN_SECONDS:
                    kill_process_group(proc, 0, sandboxed=sandboxed)
                    break
                continue
            if timeout is not None or lost or stopped is not None:
                continue
            if on_output is not None and now >= next_flush and last_output > flushed_at:
                next_flush, flushed_at = now + output_every, last_output
                on_output(out.text(), err.text())
            elif on_quiet is not None and now >= next_flush + output_every:
                next_flush = now
                on_quiet(out.text())
            if (
                stop_when is not None
                and now >= next_stop_check
                and last_output > checked_at
            ):
                next_stop_check, checked_at = now + _STOP_CHECK_SECONDS, last_output
                stopped = stop_when(out.text(), err.text())
            if stopped is not None:
                pass
            elif timeout_seconds and now - started >= timeout_seconds:
                timeout = "total"
            elif idle_timeout_seconds and now - last_progress >= idle_timeout_seconds:
                timeout = "idle"
            elif deadline is not None and now >= deadline:
                timeout = "deadline"
            elif now >= next_keep_alive:
                next_keep_alive = now + keep_alive_every
                lost = not keep_alive()
            if timeout is not None or lost or stopped is not None:
                grace = grace_seconds if stopped is None else stop_grace
                kill_process_group(proc, grace, sandboxed=sandboxed)
        selector.close()
    except BaseException:
        # Whatever happened to the runner (an error, SystemExit from SIGTERM), the step's
        # processes must not outlive it unrecorded.
        kill_process_group(proc, 0, sandboxed=sandboxed)
        raise
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        refused = relay.stop() if relay is not None else None
    code = proc.wait()
    try:
        # The step is over: whatever it left running in its group goes too. (The group id
        # cannot be reused while any member is alive, so this never hits a stranger.)
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    report = _guard_report(report_read)
    if "spawnError" in report:
        return _not_started(STEP_SPAWN_FAILED.format(error=report["spawnError"]))
    if sandboxed:
        code = _inside_code(report.get("status"), code)
    return ProcessResult(
        pid=proc.pid,
        exit_code=code if code >= 0 else None,
        signal_name=signal.Signals(-code).name if code < 0 else None,
        stdout=out.text(),
        stderr=err.text(),
        duration_ms=int((time.monotonic() - started) * 1000),
        timeout=timeout,
        lost=lost,
        stopped=stopped,
        ended=_count(report.get("ended")),
        egress_refused=refused or None,
    )


def _inside_code(status: object, outer: int) -> int:
    """The step's exit code as Popen gives it (negative: its signal) from the guard's wait
    status; bwrap's own when the guard wrote none (it could not start)."""
    if not isinstance(status, int) or status < 0:
        return outer
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else outer


def inside_guard_argv(
    report_fd: int, grace_seconds: float, egress_spec: str
) -> list[str]:
    """The guard inside a sandbox (runs.sandbox): the base interpreter, the guard bound at
    INSIDE_DIR, no runner pid (not in its namespace), the egress relay's inside half."""
    return [
        guard_python(),
        "-I",
        "-S",
        f"{INSIDE_DIR}/stepguard.py",
        str(report_fd),
        str(grace_seconds),
        "0",
        egress_spec,
        "--",
    ]


class EgressRelay:
    """The outside half of a sandboxed step's egress (agents.egress), in threads of this
    process while the step runs, listening on a socket in a private directory."""

    def __init__(self, relay: Relay, listener: socket.socket, socket_dir: str) -> None:
        self.relay = relay
        self.listener = listener
        self.socket_dir = socket_dir

    @classmethod
    def start(cls, rules: list[tuple[str, int | None]]) -> EgressRelay:
        socket_dir = tempfile.mkdtemp(prefix="loopsweb-egress-")  # mode 0700
        try:
            relay, listener = start_outside(
                os.path.join(socket_dir, "egress.sock"), rules
            )
        except OSError:
            shutil.rmtree(socket_dir, ignore_errors=True)
            raise
        return cls(relay, listener, socket_dir)

    def stop(self) -> dict[str, int]:
        """Stop listening; what it refused (host:port -> connections). A connection still
        open ends when the sandbox's processes are gone (its inside end closes)."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        with self.relay.lock:
            return dict(self.relay.refused)


def guarded_argv(report_fd: int, grace_seconds: float, argv: list[str]) -> list[str]:
    """`argv` run under the step guard (agents.stepguard), which reports on `report_fd`."""
    return [
        sys.executable,
        "-I",
        "-S",
        STEP_GUARD,
        str(report_fd),
        str(grace_seconds),
        str(os.getpid()),
        "--",
        *argv,
    ]


def _guard_report(fd: int) -> dict[str, object]:
    """What the guard wrote on its report pipe (it has exited: the read cannot block)."""
    try:
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(65536)
        found = json.loads(raw.splitlines()[-1]) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _count(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _not_started(error: str) -> ProcessResult:
    return ProcessResult(
        pid=None,
        exit_code=None,
        signal_name=None,
        stdout="",
        stderr="",
        duration_ms=0,
        spawn_error=error,
    )
