"""Process supervision: a step runs as its own process group, and nothing of it outlives
the step unrecorded.

- `run_process(invocation=, limits=, watch=)`: the step runs under the step guard
  (agents.stepguard, its own process group, a child subreaper), so everything it spawns
  stays below the guard, even a process that calls `setsid`, and is ended when the step
  ends (the count is `ProcessResult.ended`); bounded stdout/stderr tails; `timeoutMs` and
  `idleTimeoutMs` (`Limits`) enforced by killing the group (SIGTERM, then SIGKILL after
  the grace period); the run's lease renewed through `ProcessWatch.keep_alive` about three
  times per lease; when the step's process exits, anything it left running in its group is
  killed. Its stages: `_spawn`, `_Supervisor.run` (the read/watch loop), `_Supervisor._stop`,
  `_finished` (the result).
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
# With no grace, the guard still gets this long to kill what left its group
# (agents/stepguard.py, "on SIGTERM").
_GUARD_SWEEP_SECONDS = 0.2

# How long output pipes may stay open after the step's process exited (a grandchild holding
# them) before the rest of the group is killed.
_PIPE_DRAIN_SECONDS = 0.5
_SELECT_SECONDS = 0.1
_READ_BYTES = 65536
_STOP_CHECK_SECONDS = 0.5
# Of a very long output line, `ProcessWatch.line` sees the start (what tells an event's kind).
_LINE_BYTES = 65536


# --- a step's process -------------------------------------------------------------------------


class OutputTail:
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


class LineSplitter:
    """Splits a stream's data into complete lines for `on_line(stream, line)`
    (`ProcessWatch.line`); a line longer than `_LINE_BYTES` is handed on as its start."""

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


@dataclass(frozen=True, kw_only=True)
class Limits:
    """How long a step's process may run and how it is stopped; seconds unless named."""

    tail_bytes: int  # kept of stdout and of stderr each (the start is dropped)
    grace_seconds: float  # SIGTERM to SIGKILL when the step is killed
    # The step's total time (`timeoutMs`), and its time with no progress (`idleTimeoutMs`):
    # `ProcessResult.timeout` "total" and "idle". None: no limit.
    timeout_seconds: float | None = None
    idle_timeout_seconds: float | None = None
    deadline: float | None = None  # a `time.monotonic()` value: timeout "deadline"
    # The grace of a step `ProcessWatch.stop_when` stopped (None: `grace_seconds`).
    stop_grace_seconds: float | None = None
    keep_alive_every: float = 60.0  # how often `ProcessWatch.keep_alive` is called
    output_every: float = 5.0  # how often at most `ProcessWatch.flush` is called


class ProcessWatch:
    """What `run_process` tells while a step's process runs, and what it asks; each method
    is a no-op (or "go on") here, for a caller to override."""

    @property
    def tracks_progress(self) -> bool:
        """True: `line` says which output lines show progress, and the idle limit counts
        from the last that did (an agent that only retries or logs errors is idle). False:
        the output is not split into lines, and the idle limit counts from any output."""
        return False

    def spawned(self, pid: int) -> None:
        """The step's process started (the guard's pid, the leader of its group)."""

    def keep_alive(self) -> bool:
        """Called every `Limits.keep_alive_every` while the process lives (the lease
        renewal); False means the run is no longer ours and the group is killed."""
        return True

    def flush(self, stdout: str, stderr: str) -> None:
        """The tails while the step runs: at most every `Limits.output_every` and only when
        there is output not seen yet, so a step that ends within that is never flushed."""

    def quiet(self, stdout: str) -> None:
        """Called every `Limits.output_every` in which nothing was flushed: what a step
        writes elsewhere (codex's rollout file) changes while its output does not."""

    def stop_when(self, stdout: str, stderr: str) -> str | None:
        """Called when new output arrived (at most every `_STOP_CHECK_SECONDS`): a reason
        to stop the step now (`ProcessResult.stopped`), or None."""
        return None

    def line(self, stream: str, text: str) -> bool:
        """One complete output line of `stream` ("stdout" or "stderr"), with
        `tracks_progress`: whether it shows progress."""
        return False


def run_process(
    *, invocation: Invocation, limits: Limits, watch: ProcessWatch | None = None
) -> ProcessResult:
    """Run one step's process to the end under `limits`, telling `watch`; never raises for
    the process's own failures."""
    started = time.monotonic()
    spawned = _spawn(invocation, limits.grace_seconds)
    if isinstance(spawned, str):
        return _not_started(STEP_SPAWN_FAILED.format(error=spawned))
    proc = spawned.proc
    supervisor = _Supervisor(
        proc, limits, watch or ProcessWatch(), started, sandboxed=spawned.sandboxed
    )
    try:
        supervisor.watch.spawned(proc.pid)
        supervisor.run()
    except BaseException:
        # Whatever happened to the runner (an error, SystemExit from SIGTERM), the step's
        # processes must not outlive it unrecorded.
        kill_process_group(proc, 0, sandboxed=spawned.sandboxed)
        raise
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        refused = spawned.relay.stop() if spawned.relay is not None else None
    return _finished(spawned, supervisor, refused)


@dataclass(frozen=True)
class _Spawned:
    proc: subprocess.Popen[bytes]
    report_read: int  # the guard's report pipe (agents.stepguard)
    relay: EgressRelay | None  # a sandboxed step's

    @property
    def sandboxed(self) -> bool:
        return self.relay is not None  # a sandboxed step always has its relay


def _spawn(invocation: Invocation, grace_seconds: float) -> _Spawned | str:
    """The step's process started under the guard (in its sandbox, with the egress relay,
    when it has one), or why it could not be."""
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
        return str(exc)
    finally:
        os.close(report_write)
    return _Spawned(proc, report_read, relay)


class _Supervisor:
    """The read/watch loop of one step's process: its output into the tails and the watch,
    its limits enforced; how it ended (`timeout`, `lost`, `stopped`) for the result."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        limits: Limits,
        watch: ProcessWatch,
        started: float,
        *,
        sandboxed: bool,
    ) -> None:
        self.proc = proc
        self.limits = limits
        self.watch = watch
        self.started = started
        self.sandboxed = sandboxed
        self.out, self.err = (
            OutputTail(limits.tail_bytes),
            OutputTail(limits.tail_bytes),
        )
        self.timeout: str | None = None
        self.lost = False
        self.stopped: str | None = None
        self.last_output = self.last_progress = started
        self.next_keep_alive = started + limits.keep_alive_every
        self.next_flush = started + limits.output_every
        self.next_stop_check = started
        self.flushed_at = self.checked_at = started  # output up to here was seen

    @property
    def ending(self) -> bool:
        """The step is being stopped (a limit, the lease, `stop_when`)."""
        return self.timeout is not None or self.lost or self.stopped is not None

    def run(self) -> None:
        """Until the process exited and its pipes closed (or were given up on)."""
        proc = self.proc
        selector = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        lines = {
            id(tail): LineSplitter(name, self.watch.line)
            for tail, name in ((self.out, "stdout"), (self.err, "stderr"))
            if self.watch.tracks_progress
        }
        selector.register(proc.stdout, selectors.EVENT_READ, self.out)
        selector.register(proc.stderr, selectors.EVENT_READ, self.err)
        exited_at: float | None = None
        while True:
            self._read(selector, lines)
            now = time.monotonic()
            if proc.poll() is not None:
                if not selector.get_map():
                    break
                # Exited; pipes still open means a grandchild holds them: give it a moment to
                # flush, then end the whole group so the step cannot leave anything behind.
                exited_at = exited_at or now
                if now - exited_at > _PIPE_DRAIN_SECONDS:
                    kill_process_group(proc, 0, sandboxed=self.sandboxed)
                    break
                continue
            if self.ending:
                continue
            self._tell(now)
            self._check(now)
            if self.ending:
                self._stop()
        selector.close()

    def _read(
        self, selector: selectors.BaseSelector, lines: dict[int, LineSplitter]
    ) -> None:
        """What the pipes have (waiting up to `_SELECT_SECONDS`)."""
        if not selector.get_map():
            # Both pipes closed but the process lives on: keep enforcing the limits, and go
            # on the moment it exits (a sandbox's bwrap outlives its pipes by a few
            # milliseconds: a plain sleep cost every such step 100 ms).
            try:
                self.proc.wait(timeout=_SELECT_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            return
        for key, _ in selector.select(_SELECT_SECONDS):
            data = os.read(key.fd, _READ_BYTES)
            if not data:
                selector.unregister(key.fileobj)
                continue
            key.data.add(data)
            self.last_output = time.monotonic()
            reader = lines.get(id(key.data))
            if reader is None or reader.feed(data):
                self.last_progress = self.last_output

    def _tell(self, now: float) -> None:
        """The watch's `flush`, `quiet` and `stop_when`, each when it is due."""
        every = self.limits.output_every
        if now >= self.next_flush and self.last_output > self.flushed_at:
            self.next_flush, self.flushed_at = now + every, self.last_output
            self.watch.flush(self.out.text(), self.err.text())
        elif now >= self.next_flush + every:
            self.next_flush = now
            self.watch.quiet(self.out.text())
        if now >= self.next_stop_check and self.last_output > self.checked_at:
            self.next_stop_check = now + _STOP_CHECK_SECONDS
            self.checked_at = self.last_output
            self.stopped = self.watch.stop_when(self.out.text(), self.err.text())

    def _check(self, now: float) -> None:
        """The limits, then the lease: the first reached ends the step."""
        limits = self.limits
        if self.stopped is not None:
            pass
        elif limits.timeout_seconds and now - self.started >= limits.timeout_seconds:
            self.timeout = "total"
        elif (
            limits.idle_timeout_seconds
            and now - self.last_progress >= limits.idle_timeout_seconds
        ):
            self.timeout = "idle"
        elif limits.deadline is not None and now >= limits.deadline:
            self.timeout = "deadline"
        elif now >= self.next_keep_alive:
            self.next_keep_alive = now + limits.keep_alive_every
            self.lost = not self.watch.keep_alive()

    def _stop(self) -> None:
        """Kill the group: a step `stop_when` stopped gets `Limits.stop_grace_seconds`."""
        limits = self.limits
        grace = limits.grace_seconds
        if self.stopped is not None and limits.stop_grace_seconds is not None:
            grace = limits.stop_grace_seconds
        kill_process_group(self.proc, grace, sandboxed=self.sandboxed)


def _finished(
    spawned: _Spawned, supervisor: _Supervisor, refused: dict[str, int] | None
) -> ProcessResult:
    """The result of a process that ended: its exit as the guard reported it."""
    proc = spawned.proc
    code = proc.wait()
    try:
        # The step is over: whatever it left running in its group goes too. (The group id
        # cannot be reused while any member is alive, so this never hits a stranger.)
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    report = _guard_report(spawned.report_read)
    if "spawnError" in report:
        return _not_started(STEP_SPAWN_FAILED.format(error=report["spawnError"]))
    if spawned.sandboxed:
        code = _inside_code(report.get("status"), code)
    return ProcessResult(
        pid=proc.pid,
        exit_code=code if code >= 0 else None,
        signal_name=signal.Signals(-code).name if code < 0 else None,
        stdout=supervisor.out.text(),
        stderr=supervisor.err.text(),
        duration_ms=int((time.monotonic() - supervisor.started) * 1000),
        timeout=supervisor.timeout,
        lost=supervisor.lost,
        stopped=supervisor.stopped,
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
