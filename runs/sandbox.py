"""Each agent step in an OS sandbox that holds its run and nothing of loopsweb (docs/isolation.md §7).

The engine is bubblewrap (`bwrap`): the unprivileged, audited namespace tool that Flatpak and
Claude Code's own Linux sandbox are built on. loopsweb decides what is bound; bwrap makes it
so. Deny by default: the sandbox's root is an empty tmpfs, and only what is bound exists:

- read-write: the run's worktree (or, with no worktree, the step's working directory), the
  account's login homes (`CODEX_HOME`, `CLAUDE_CONFIG_DIR`, opencode's XDG dirs, a `HOME`
  the account sets), the operator's `LOOPSWEB_AGENT_SANDBOX_BIND`;
- read-only: the project's git common dir, the account's configuration files (they name the
  endpoints the network rule allows), the CLI's installation (its `node_modules`, else the
  binary itself) and its interpreter, the system toolchain (`/usr`, a few files of `/etc`),
  the step guard with its egress relay, the operator's `LOOPSWEB_AGENT_SANDBOX_RO_BIND`;
- private: `/tmp`, `/dev` (minimal), `/proc` (its own PID namespace), `HOME` when the account
  sets none;
- hidden even inside a bound directory: every account's env file, the GitHub token file and
  loopsweb's own secrets (`secret_key`, `loopsweb.env`, the SQLite database).

Processes: new PID, IPC, UTS and network namespaces, a new session, no new privileges, every
capability dropped (bwrap's defaults for root too). The step guard is the namespace's first
process: when it exits, the kernel ends every process left in it.

Network: the namespace has only `lo`. The egress relay (agents.egress) lets the step reach its
account's provider endpoints and `LOOPSWEB_AGENT_EGRESS_ALLOW`, nothing else (`egress_rules`).

`sandbox_problem()` says why a step cannot be sandboxed here (bwrap missing, namespaces
refused, an operator bind that exposes what must stay hidden); admission refuses a
write-enabled route then, and health, `check --deploy` and every operator page report it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from agents import egress, stepguard
from ledger.held_secrets import protected_paths, secret_files
from ledger.selectors import ACCOUNT_HOME_VARIABLES
from runs.sandbox_egress import egress_rules

SANDBOX_BWRAP = "bwrap"
SANDBOX_OFF = "off"
SANDBOX_MODES = (SANDBOX_BWRAP, SANDBOX_OFF)

BWRAP_MISSING = (
    "the agent sandbox cannot run: bubblewrap (bwrap) is not installed; install it "
    "(Debian/Ubuntu: apt-get install bubblewrap) or set LOOPSWEB_AGENT_SANDBOX=off to run "
    "agents unsandboxed"
)
BWRAP_REFUSED = (
    "the agent sandbox cannot run: bwrap could not create its namespaces ({error}); enable "
    "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
    "the AppArmor profile for bwrap) or run loopsweb as root"
)
BIND_EXPOSES = (
    "the agent sandbox cannot run: {setting} names {path}, which would expose {what} to "
    "the agent"
)
BIND_NOT_ABSOLUTE = (
    "the agent sandbox cannot run: {setting} names {path!r}, not an absolute path"
)
SANDBOX_OFF_WARNING = (
    "LOOPSWEB_AGENT_SANDBOX=off: agents run unsandboxed, as loopsweb's own user, and can "
    "read its secrets (docs/isolation.md)"
)

# Inside the sandbox: where the guard, its relay and the relay's socket are.
INSIDE_DIR = "/loopsweb"
INSIDE_SOCKET_DIR = f"{INSIDE_DIR}/net"
PRIVATE_HOME = "/tmp/home"
SANDBOX_UID = 1000  # the step's uid inside when loopsweb runs as root
# The guard and its relay's inside half: standard-library scripts, bound side by side.
_GUARD_FILES = (stepguard, egress)
_ETC_FILES = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "gai.conf",
    "group",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "passwd",
    "pki",
    "protocols",
    "resolv.conf",
    "services",
    "ssl",
    "timezone",
)
_TOP_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def sandbox_mode() -> str:
    return str(getattr(settings, "LOOPSWEB_AGENT_SANDBOX", SANDBOX_BWRAP))


def sandbox_on() -> bool:
    return sandbox_mode() != SANDBOX_OFF


# --- can it run here? ---------------------------------------------------------------------------

_probe_cache: dict[str, tuple[float, str | None]] = {}
_PROBE_SECONDS = 60.0


def _bwrap_probe(binary: str) -> str | None:
    """None when bwrap creates every namespace a step needs, else what it said."""
    argv = [
        binary,
        "--ro-bind",
        "/",
        "/",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--",
        "/bin/true",
    ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return None


def bwrap_binary() -> str | None:
    return shutil.which("bwrap")


def sandbox_problem() -> str | None:
    """Why agent steps cannot run sandboxed on this host (one line), or None: they can, or
    the operator turned the sandbox off (`sandbox_warning` says so). Cached for a minute."""
    if not sandbox_on():
        return None
    binary = bwrap_binary()
    if binary is None:
        return BWRAP_MISSING
    now = time.monotonic()
    cached = _probe_cache.get(binary)
    if cached is None or now - cached[0] > _PROBE_SECONDS:
        error = _bwrap_probe(binary)
        cached = (now, BWRAP_REFUSED.format(error=error) if error else None)
        _probe_cache[binary] = cached
    return cached[1] or operator_bind_problem()


def admission_sandbox_problem(steps: Iterable[Mapping[str, object]]) -> str | None:
    """Why a route whose agent steps may write cannot be admitted here (the sandbox cannot
    run), or None."""
    writes = any(
        isinstance(target := step.get("target"), dict)
        and target.get("type") == "agent"
        and target.get("sandbox") != "read-only"
        for step in steps
    )
    return sandbox_problem() if writes else None


def sandbox_warning() -> str | None:
    """The red line every operator page shows: the sandbox is off, or cannot run."""
    if not sandbox_on():
        return SANDBOX_OFF_WARNING
    return sandbox_problem()


# --- what must never be bound -------------------------------------------------------------------


def _overlaps(a: str, b: str) -> bool:
    return Path(a).is_relative_to(b) or Path(b).is_relative_to(a)


def operator_binds() -> tuple[list[str], list[str]]:
    return (
        list(getattr(settings, "LOOPSWEB_AGENT_SANDBOX_BIND", [])),
        list(getattr(settings, "LOOPSWEB_AGENT_SANDBOX_RO_BIND", [])),
    )


def operator_bind_problem() -> str | None:
    read_write, read_only = operator_binds()
    if not read_write and not read_only:
        return None
    home = os.path.realpath(os.path.expanduser("~"))
    protected = protected_paths()
    for setting, paths in (
        ("LOOPSWEB_AGENT_SANDBOX_BIND", read_write),
        ("LOOPSWEB_AGENT_SANDBOX_RO_BIND", read_only),
    ):
        for path in paths:
            if not os.path.isabs(path):
                return BIND_NOT_ABSOLUTE.format(setting=setting, path=path)
            real = os.path.realpath(path)
            if Path(home).is_relative_to(real):
                return BIND_EXPOSES.format(
                    setting=setting, path=path, what="the operator's home"
                )
            for protected_path, what in protected:
                if _overlaps(real, protected_path):
                    return BIND_EXPOSES.format(setting=setting, path=path, what=what)
    return None


# --- a step's sandbox ---------------------------------------------------------------------------


@dataclass
class StepSandbox:
    """What one step's sandbox holds (module docstring); `bwrap_argv` makes it so."""

    read_write: list[str] = field(default_factory=list)
    read_only: list[str] = field(default_factory=list)
    # bound read-only over what is bound read-write (the git dir, the account's config)
    read_only_over: list[str] = field(default_factory=list)
    home: str = PRIVATE_HOME
    rules: list[tuple[str, int | None]] = field(default_factory=list)
    forwards: dict[int, str] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)
    # file -> where it is bound inside (a CLI that is no package: never at its own path)
    relocated: dict[str, str] = field(default_factory=dict)

    @property
    def proxy_port(self) -> int:
        port = egress.PROXY_PORT
        while port in self.forwards:
            port += 1
        return port

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The step's environment inside: its HOME and the relay's proxy."""
        proxy = f"http://127.0.0.1:{self.proxy_port}"
        inside = dict(env)
        inside["HOME"] = self.home
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            inside[name] = proxy
        for name in ("NO_PROXY", "no_proxy"):
            inside[name] = "localhost,127.0.0.1,::1"
        inside.pop("ALL_PROXY", None)
        inside.pop("all_proxy", None)
        # /var/tmp (private too): codex refuses to put its sandbox helper beside a CODEX_HOME
        # that lies under the temporary dir, and then cannot run a command (docs/agents.md).
        inside["TMPDIR"] = "/var/tmp"
        return inside

    def egress_spec(self) -> str:
        return json.dumps(
            {
                "socket": f"{INSIDE_SOCKET_DIR}/egress.sock",
                "forwards": {str(port): host for port, host in self.forwards.items()},
                "proxy": self.proxy_port,
            }
        )

    def bwrap_argv(self, socket_dir: str, cwd: str | None) -> list[str]:
        """bwrap and its options, up to the command (`--` included)."""
        binary = bwrap_binary() or "bwrap"
        argv = [binary, "--die-with-parent", "--new-session", "--as-pid-1"]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"]
        argv += ["--unshare-cgroup-try", "--hostname", "loopsweb-step"]
        if os.getuid() == 0:
            # root runs the step as an ordinary uid of a user namespace of its own: no
            # capability anywhere, and a CLI's own sandbox (codex's bwrap) can still map
            # its uid, which needs CAP_SETFCAP for uid 0 (measured, docs/isolation.md §7).
            argv += [
                "--unshare-user",
                "--uid",
                str(SANDBOX_UID),
                "--gid",
                str(SANDBOX_UID),
            ]
        argv += ["--cap-drop", "ALL"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        argv += ["--dir", PRIVATE_HOME, "--tmpfs", "/var/tmp"]
        if self.home != PRIVATE_HOME and not os.path.exists(self.home):
            argv += ["--dir", self.home]
        for source, target in _toolchain():
            argv += (
                ["--symlink", source, target]
                if target in _top_links()
                else ["--ro-bind", source, target]
            )
        for path in self.read_only:
            argv += ["--ro-bind", path, path]
        for path in self.read_write:
            argv += ["--bind", path, path]
        for path in self.read_only_over:
            argv += ["--ro-bind", path, path]
        for path in self.hidden:
            if os.path.isdir(path):
                argv += ["--tmpfs", path]
            else:
                argv += ["--ro-bind", "/dev/null", path]
        for module in _GUARD_FILES:
            name = Path(module.__file__ or "").name
            argv += ["--ro-bind", str(module.__file__), f"{INSIDE_DIR}/{name}"]
        for source, target in self.relocated.items():
            argv += ["--ro-bind", source, target]
        argv += ["--bind", socket_dir, INSIDE_SOCKET_DIR]
        # The root's skeleton (the directories leading to what is bound) is read-only: only
        # the binds and the private tmpfs mounts can be written.
        argv += ["--remount-ro", "/", "--chdir", cwd or "/"]
        return [*argv, "--"]

    def command(self, argv: list[str]) -> list[str]:
        """The step's argv inside: a binary bound under INSIDE_DIR runs from there."""
        inside = {source: target for source, target in self.relocated.items()}
        real = os.path.realpath(argv[0])
        return [inside.get(real, argv[0]), *argv[1:]] if argv else argv


def _top_links() -> dict[str, str]:
    return {
        f"/{name}": os.readlink(f"/{name}")
        for name in _TOP_LINKS
        if os.path.islink(f"/{name}")
    }


def _toolchain() -> list[tuple[str, str]]:
    """(source, target) of the system toolchain: `/usr`, the top-level links or dirs, `/etc`
    files, the interpreter that runs the guard."""
    found: list[tuple[str, str]] = [("/usr", "/usr")]
    links = _top_links()
    for name in _TOP_LINKS:
        path = f"/{name}"
        if path in links:
            found.append((links[path], path))
        elif os.path.isdir(path):
            found.append((path, path))
    for name in _ETC_FILES:
        path = f"/etc/{name}"
        if os.path.exists(path):
            found.append((path, path))
    python = guard_python()
    if not Path(python).is_relative_to("/usr"):
        prefix = os.path.realpath(sys.base_prefix)
        found.append((prefix, prefix))
    return found


def guard_python() -> str:
    """The interpreter the guard runs on inside (it needs the standard library only): the
    system's python3 under /usr, else this one's base installation; never the venv."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def installation_of(binary: str) -> list[str]:
    """What a CLI needs of its installation: its outermost `node_modules` (the package and
    what it depends on), else the binary itself; and its interpreter's installation when the
    script names one outside the toolchain."""
    real = os.path.realpath(binary)
    found: list[str] = []
    parts = Path(real).parts
    if "node_modules" in parts:
        index = parts.index("node_modules")
        found.append(str(Path(*parts[: index + 1])))
    if os.path.realpath(os.path.dirname(binary)) != os.path.dirname(real):
        link_parts = Path(binary).parts
        if "node_modules" in link_parts:
            index = link_parts.index("node_modules")
            found.append(str(Path(*link_parts[: index + 1])))
    interpreter = _interpreter(real)
    if interpreter is not None and not Path(interpreter).is_relative_to("/usr"):
        found.append(str(Path(interpreter).parent.parent))
    return list(dict.fromkeys(found))


def _interpreter(script: str) -> str | None:
    """The real path of the ELF interpreter a script's `#!` line runs, if any."""
    try:
        with open(script, "rb") as handle:
            line = handle.readline(256)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    words = line[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    program = words[0]
    if os.path.basename(program) == "env" and len(words) > 1:
        # `env` inside finds the first PATH entry that exists there: the toolchain's own copy
        # when there is one (nothing to bind), else the one on PATH here.
        if shutil.which(words[-1], path="/usr/local/bin:/usr/bin:/bin"):
            return None
        program = shutil.which(words[-1]) or ""
    if not program:
        return None
    real = os.path.realpath(program)
    try:
        with open(real, "rb") as handle:
            if handle.read(4) != b"\x7fELF":
                return None  # a shim script: the toolchain's own interpreter serves
    except OSError:
        return None
    return real


def _existing(paths: Iterable[str | None]) -> list[str]:
    found = []
    for path in paths:
        if path and os.path.exists(path):
            real = os.path.realpath(path)
            if real not in found:
                found.append(real)
    return found


def step_sandbox(
    *,
    provider: str,
    binary: str,
    root: str,
    common_dir: str | None,
    account_env: Mapping[str, str],
    extra_read_only: Iterable[str] = (),
) -> StepSandbox:
    """The sandbox of one agent step (module docstring): `root` its worktree (or working
    directory), `common_dir` the project's git dir, `account_env` its account's variables."""
    homes = _existing(account_env.get(name) for name in ACCOUNT_HOME_VARIABLES)
    config_files = _existing(
        [
            os.path.join(
                account_env.get("CODEX_HOME") or "/nonexistent", "config.toml"
            ),
            os.path.join(
                account_env.get("CLAUDE_CONFIG_DIR") or "/nonexistent", "settings.json"
            ),
            *(
                os.path.join(
                    account_env.get("XDG_CONFIG_HOME") or "/nonexistent",
                    "opencode",
                    name,
                )
                for name in ("opencode.json", "opencode.jsonc", "config.json")
            ),
        ]
    )
    read_write_op, read_only_op = operator_binds()
    real = os.path.realpath(binary)
    relocated = (
        {}
        if "node_modules" in Path(real).parts or Path(real).is_relative_to("/usr")
        else {real: f"{INSIDE_DIR}/bin/{os.path.basename(binary)}"}
    )
    box = StepSandbox(
        relocated=relocated,
        read_only=_existing(
            [*installation_of(binary), *extra_read_only, *read_only_op]
        ),
        read_write=_existing([*homes, root, *read_write_op]),
        # With no worktree the step works in the project itself: its git dir stays
        # read-only all the same (config, hooks and refs).
        read_only_over=_existing(
            [common_dir or os.path.join(root, ".git"), *config_files]
        ),
        rules=egress_rules(provider, account_env),
    )
    account_home = account_env.get("HOME")
    if account_home and os.path.isabs(account_home):
        # The account's own HOME: bound when it exists, else an empty directory inside.
        box.home = account_home
    box.forwards = {
        port: host
        for host, port in box.rules
        if port is not None and egress.is_loopback(host)
    }
    bound = [*box.read_write, *box.read_only, *box.read_only_over]
    box.hidden = [
        path
        for path in secret_files(homes)
        if os.path.exists(path)
        and path not in bound
        and any(Path(path).is_relative_to(b) for b in bound)
    ]
    return box
