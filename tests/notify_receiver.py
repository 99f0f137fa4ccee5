"""A webhook receiver for the notification tests: a standard library HTTP server on
127.0.0.1 that records every POST (its path with query, Content-Type, JSON body) and
answers the statuses it is given in turn, 200 once they are used up.

    receiver = Receiver([500])      # the first POST answers 500, the next ones 200
    settings.LOOPSWEB_NOTIFY_URL = receiver.url
    ...
    receiver.messages               # [{"path", "content_type", "body"}, ...]
    receiver.close()
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_PATH = "/hooks/T000/B000/secret-token?sig=secret-query"


class Receiver:
    def __init__(self, statuses: Iterable[int] = (), *, redirect: str = "") -> None:
        self.statuses = list(statuses)
        self.redirect = redirect
        self.messages: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server name)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with receiver.lock:
                    receiver.messages.append(
                        {
                            "path": self.path,
                            "content_type": self.headers.get("Content-Type"),
                            "body": json.loads(raw or b"null"),
                        }
                    )
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                if 300 <= status < 400 and receiver.redirect:
                    self.send_header("Location", receiver.redirect)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{TOKEN_PATH}"

    def texts(self) -> list[str]:
        with self.lock:
            return [m["body"]["text"] for m in self.messages]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def unreachable_url() -> str:
    """A loopback URL nothing listens on (a port bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{TOKEN_PATH}"
