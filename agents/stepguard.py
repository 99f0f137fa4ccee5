"""The step guard: the parent of every step's process, so nothing the step starts outlives it.

runs.processes runs each step as
`python -I -S stepguard.py REPORT_FD GRACE RUNNER_PID [EGRESS] -- ARGV...`
(standard library only, no Django). In a sandbox (runs.sandbox) the guard is the first
process of the step's PID namespace: RUNNER_PID is 0 (the runner is not in its namespace), and
when the guard exits the kernel ends whatever is left in the namespace. EGRESS, a JSON object
`{"socket": PATH, "forwards": {PORT: HOST}, "proxy": PORT}`, starts the inside half of the
egress relay (agents.egress) before the step. The guard:

1. makes itself a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`): a process the step
   starts that leaves its parent (a daemon that forks and calls `setsid`, say) is
   re-parented to the guard instead of to init, so the guard still sees it;
2. asks for SIGTERM when the runner's thread goes away (`PR_SET_PDEATHSIG`);
3. starts ARGV in its own process group (the guard leads it, as `start_new_session` did for
   the step before), with the same working directory, environment and standard streams;
4. when the step's process exits, ends every descendant still alive (SIGKILL, repeated
   until none is left, each reaped), writes `{"ended": N, "status": S}` (S the step's wait
   status; or `{"spawnError": "..."}`) to REPORT_FD, and exits as the step did (its exit
   code, or the same signal: as a namespace's first process it cannot die of its own signal,
   so the runner reads S);
5. on SIGTERM (the runner ending the step, or a kill of its group): descendants in its
   group get SIGTERM and GRACE seconds, as before; those outside it, which the group's
   signals cannot reach, are killed at once, and again every 50 ms until the step exits.

Descendants are found in /proc (parent pids), the guard's own subtree only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SWEEP_SECONDS = 0.05
MAX_SWEEPS = 200


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) of every process in /proc."""
    found: dict[int, tuple[int, int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        found[int(name)] = (int(fields[1]), int(fields[2]), fields[0])
    return found


def descendants() -> dict[int, int]:
    """pid -> process group of every live process below the guard (zombies left out)."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _group, _state) in table.items():
        children.setdefault(parent, []).append(pid)
    below: dict[int, int] = {}
    todo = list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        if pid in below:
            continue
        if table[pid][2] != "Z":
            below[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return below


def _signal(pid: int, number: int) -> bool:
    try:
        os.kill(pid, number)
        return True
    except ProcessLookupError:
        return False


def _reap() -> list[tuple[int, int]]:
    """(pid, status) of every child that has ended, without waiting."""
    ended: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, status))


class Guard:
    def __init__(self, report_fd: int, grace: float, runner: int) -> None:
        self.report_fd = report_fd
        self.grace = grace
        self.runner = runner
        self.ended: set[int] = set()
        self.step: int | None = None
        self.status: int | None = None
        self.terminating = False
        self.kill_at = float("inf")

    def kill_outside_group(self) -> None:
        group = os.getpgrp()
        for pid, pgid in descendants().items():
            if pgid != group and _signal(pid, signal.SIGKILL):
                self.ended.add(pid)

    def on_term(self, _signum: int, _frame: object) -> None:
        if not self.terminating:
            self.terminating = True
            for pid, pgid in descendants().items():
                if pgid == os.getpgrp() and pid != self.step:
                    _signal(pid, signal.SIGTERM)
            if self.step is not None:
                _signal(self.step, signal.SIGTERM)
            self.kill_at = time.monotonic() + self.grace
            signal.setitimer(signal.ITIMER_REAL, SWEEP_SECONDS, SWEEP_SECONDS)
        self.kill_outside_group()

    def on_alarm(self, _signum: int, _frame: object) -> None:
        self.kill_outside_group()
        if time.monotonic() >= self.kill_at:
            # The runner would have sent SIGKILL by now; it may be gone (PDEATHSIG).
            for pid in descendants():
                _signal(pid, signal.SIGKILL)

    def kill_all(self) -> None:
        """End every descendant left, reaping as it goes (module docstring, "when the step's
        process exits")."""
        for _ in range(MAX_SWEEPS):
            left = descendants()
            if not left:
                break
            for pid in left:
                if _signal(pid, signal.SIGSTOP):
                    self.ended.add(pid)
            for pid in left:
                _signal(pid, signal.SIGKILL)
            for pid, status in _reap():
                self._reaped(pid, status)
        for pid, status in _reap():
            self._reaped(pid, status)

    def _reaped(self, pid: int, status: int) -> None:
        if pid == self.step and self.status is None:
            self.status = status

    def report(self, line: str) -> None:
        try:
            os.write(self.report_fd, line.encode() + b"\n")
        except OSError:
            pass

    def run(self, argv: list[str]) -> int:
        """Run the step (module docstring); its wait status."""
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGALRM, self.on_alarm)
        if self.runner and os.getppid() != self.runner:  # gone before PDEATHSIG was set
            return 1 << 8
        # posix_spawn, not subprocess: the guard starts with every step, and its start-up is
        # most of its cost. The report pipe is not inherited (close-on-exec); SIGPIPE and
        # SIGXFSZ, which Python ignores, are the step's default again.
        os.set_inheritable(self.report_fd, False)
        try:
            self.step = os.posix_spawnp(
                argv[0], argv, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
            )
        except (OSError, ValueError) as exc:
            import json

            self.report(json.dumps({"spawnError": str(exc)}))
            return 127 << 8
        while self.status is None:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            self._reaped(pid, status)
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.kill_all()
        self.ended.discard(self.step)
        status = self.status if self.status is not None else 0
        self.report(f'{{"ended": {len(self.ended)}, "status": {status}}}')
        return status


def start_egress(spec: str) -> None:
    """The inside half of the egress relay (agents.egress, bound beside this file)."""
    import importlib.util
    import json

    config = json.loads(spec)
    where = os.path.join(os.path.dirname(os.path.abspath(__file__)), "egress.py")
    found = importlib.util.spec_from_file_location("loopsweb_egress", where)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    forwards = {int(port): str(host) for port, host in config["forwards"].items()}
    module.start_inside(config["socket"], forwards, int(config["proxy"]))


def main(args: list[str]) -> None:
    egress = args[3] if len(args) > 5 and args[4] == "--" else None
    first = 5 if egress is not None else 4
    if len(args) <= first or args[first - 1] != "--":
        sys.stderr.write(
            "usage: stepguard.py REPORT_FD GRACE RUNNER_PID [EGRESS] -- ARGV...\n"
        )
        sys.exit(2)
    guard = Guard(int(args[0]), float(args[1]), int(args[2]))
    if egress is not None:
        start_egress(egress)
    status = guard.run(args[first:])
    os.close(guard.report_fd)
    if os.WIFSIGNALED(status):  # end as the step ended: by the same signal
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):  # no handler to reset
            signal.signal(number, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.kill(os.getpid(), number)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
