"""A sandboxed step's only way out: a relay across the network namespace (docs/isolation.md §7).

Standard library only: the inside half runs in the step guard, outside Django.

- The OUTSIDE half (`start_outside`, threads of the runner's process while the step runs,
  runs.processes.EgressRelay) listens on a unix socket in a private directory that is
  bound into the sandbox. Each connection starts with one line, `host port`; the relay
  answers `OK` and joins it to a TCP connection to that host and port when a rule allows it,
  else `NO` (the host and port are counted as refused, `Relay.refused`).
- The INSIDE half runs in the step guard (agents.stepguard), the sandbox's first process, in
  the step's own network namespace where only `lo` exists: for each allowed endpoint on the
  host's loopback it listens on the same port of the namespace's loopback, and it serves an
  HTTP proxy (`CONNECT host:port`, or an absolute `http://` request) on `PROXY_PORT`, which the
  agent's CLI reaches through `HTTPS_PROXY`. Every connection goes out through the socket.

A rule is `host[:port]`; `*.example.com` matches every name under example.com. A loopback
address is reached only through a rule that names it (an endpoint), never a pattern: a name
that resolves to loopback through a wildcard is refused.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from collections.abc import Iterable

PROXY_PORT = 3128
# Connections one step may hold open through the relay at once: each is a thread of the
# runner's process, so a step cannot spend the worker's threads (or the pool's).
MAX_CONNECTIONS = 64
_BUFFER = 65536
_HEAD_LIMIT = 16384
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


# --- rules --------------------------------------------------------------------------------------


def parse_rule(text: str) -> tuple[str, int | None]:
    """`host[:port]` (a bracketed IPv6 host keeps its brackets off) as (host, port or None);
    ValueError when it is not one."""
    text = text.strip().lower()
    host, port = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"not host[:port]: {text!r}")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"not host[:port]: {text!r}")
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, number = text.partition(":")
        port = int(number)
    if not host or any(c.isspace() or c in "/@" for c in host):
        raise ValueError(f"not host[:port]: {text!r}")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port out of range: {text!r}")
    return host, port


def _host_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and host != pattern[2:]
    return host == pattern


def allowed(rules: Iterable[tuple[str, int | None]], host: str, port: int) -> bool:
    """Whether a rule lets the step reach `host`:`port`."""
    host = host.strip().lower().strip("[]")
    for pattern, rule_port in rules:
        if rule_port is not None and rule_port != port:
            continue
        if rule_port is None and port not in (80, 443):
            continue  # a rule without a port allows the web ports only
        if _host_matches(pattern, host):
            return True
    return False


def is_loopback(host: str) -> bool:
    """A name or address of this host itself (0.0.0.0 and IPv4-mapped forms included)."""
    text = host.strip("[]").lower()
    if text in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped or address
    return address.is_loopback or address.is_unspecified


def _reserved(ip: str) -> bool:
    """Addresses no wildcard may reach: the host's own, link-local (cloud metadata)."""
    try:
        address = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return True
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped or address
    return address.is_loopback or address.is_unspecified or address.is_link_local


# --- both halves --------------------------------------------------------------------------------


def _pump(source: socket.socket, sink: socket.socket, how: int) -> None:
    try:
        while data := source.recv(_BUFFER):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(how)
        except OSError:
            pass


def join(a: socket.socket, b: socket.socket, first: bytes = b"") -> None:
    """Copy bytes both ways until both sides are done, then close both. `a` is the client
    (the sandbox's side): once it is done, `b` is shut both ways, so a far end that keeps
    its connection open cannot hold this thread (or a relay slot) after the step."""
    try:
        if first:
            b.sendall(first)
        other = threading.Thread(target=_pump, args=(b, a, socket.SHUT_WR), daemon=True)
        other.start()
        _pump(a, b, socket.SHUT_RDWR)
        other.join()
    except OSError:
        pass
    finally:
        a.close()
        b.close()


def _read_line(sock: socket.socket, limit: int = 1024) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk or len(data) >= limit:
            break
        data += chunk
    return data


# --- outside ------------------------------------------------------------------------------------


class Relay:
    """The outside half (module docstring)."""

    def __init__(self, rules: list[tuple[str, int | None]]) -> None:
        self.rules = rules
        self.refused: dict[str, int] = {}
        self.lock = threading.Lock()
        self.open = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def refuse(self, host: str, port: int) -> None:
        with self.lock:
            key = f"{host}:{port}"
            if key in self.refused or len(self.refused) < 64:
                self.refused[key] = self.refused.get(key, 0) + 1

    def _target(self, host: str, port: int) -> socket.socket | None:
        if not allowed(self.rules, host, port):
            return None
        # A loopback host passed `allowed` only through a rule that names it (an endpoint).
        named = is_loopback(host)
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            return None
        for *_, address in found:
            ip = str(address[0])
            if _reserved(ip) and not named:
                continue  # a name that resolves to the host's own services
            try:
                return socket.create_connection((ip, port), timeout=30)
            except OSError:
                continue
        return None

    def serve_one(self, inside: socket.socket) -> None:
        try:
            head = _read_line(inside).decode("ascii", "replace").split()
            if len(head) != 2 or not head[1].isdigit():
                inside.close()
                return
            host, port = head[0], int(head[1])
            outside = self._target(host, port)
            if outside is None:
                self.refuse(host, port)
                inside.sendall(b"NO\n")
                inside.close()
                return
            outside.settimeout(None)
            inside.sendall(b"OK\n")
        except OSError:
            inside.close()
            return
        join(inside, outside)

    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if not self.open.acquire(blocking=False):
                conn.close()  # MAX_CONNECTIONS open already
                continue
            threading.Thread(
                target=self._serve_counted, args=(conn,), daemon=True
            ).start()

    def _serve_counted(self, conn: socket.socket) -> None:
        try:
            self.serve_one(conn)
        finally:
            self.open.release()


def start_outside(
    path: str, rules: list[tuple[str, int | None]]
) -> tuple[Relay, socket.socket]:
    """The outside half, in daemon threads of the calling process (the runner's): the
    relay and its listening socket at `path` (0600); closing the socket stops it."""
    relay = Relay(rules)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    threading.Thread(target=relay.serve, args=(listener,), daemon=True).start()
    return relay, listener


# --- inside -------------------------------------------------------------------------------------


def _out(path: str, host: str, port: int) -> socket.socket | None:
    """A connection to host:port through the outside relay, or None when refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(f"{host} {port}\n".encode())
        if _read_line(sock) == b"OK\n":
            return sock
    except OSError:
        pass
    sock.close()
    return None


def _forward(path: str, host: str, port: int, conn: socket.socket) -> None:
    out = _out(path, host, port)
    if out is None:
        conn.close()
        return
    join(conn, out)


def _proxy_one(path: str, conn: socket.socket) -> None:
    head = b""
    try:
        while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        line, _, rest = head.partition(b"\r\n")
        parts = line.decode("latin-1").split()
        if len(parts) != 3:
            raise ValueError
        method, target, version = parts
        if method.upper() == "CONNECT":
            host, port = parse_rule(target)
            port = port or 443
            reply = b"HTTP/1.1 200 Connection established\r\n\r\n"
            first = head.partition(b"\r\n\r\n")[2]
        elif target.lower().startswith("http://"):
            authority, slash, path_part = target[7:].partition("/")
            host, port = parse_rule(authority)
            port = port or 80
            reply = b""
            first = f"{method} {slash}{path_part} {version}\r\n".encode() + rest
        else:
            raise ValueError
        out = _out(path, host, port)
        if out is None:
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            conn.close()
            return
        if reply:
            conn.sendall(reply)
        join(conn, out, first)
    except (OSError, ValueError):
        try:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            pass
        conn.close()


def _accept(listener: socket.socket, handle: object) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()  # type: ignore[arg-type]


def _listen(port: int) -> list[socket.socket]:
    found = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(64)
            found.append(sock)
        except OSError:
            continue
    return found


def start_inside(path: str, forwards: dict[int, str], proxy_port: int) -> None:
    """The inside half (module docstring), in daemon threads of the calling process."""
    for port, host in forwards.items():
        for sock in _listen(port):
            handle = (lambda h, p: lambda conn: _forward(path, h, p, conn))(host, port)
            threading.Thread(target=_accept, args=(sock, handle), daemon=True).start()
    for sock in _listen(proxy_port):
        threading.Thread(
            target=_accept,
            args=(sock, lambda conn: _proxy_one(path, conn)),
            daemon=True,
        ).start()
