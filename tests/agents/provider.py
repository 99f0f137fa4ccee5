"""A model provider stand-in for the real agent CLIs: an HTTP server on 127.0.0.1.

Standard library only. It speaks just enough of three public APIs, streamed as server-sent
events the way the CLIs ask for them:
- the OpenAI Responses API (codex): `POST /v1/responses`;
- the OpenAI Chat Completions API (opencode through `@ai-sdk/openai-compatible`):
  `POST /v1/chat/completions`;
- the Anthropic Messages API (claude): `HEAD /` and `POST /v1/messages?beta=true`.

Every answer follows one script: while the conversation holds no tool result yet and the
request offers the CLI's file tool, answer with ONE tool call that writes `file_name` (content
`file_content`) in the working directory (codex `exec_command` with `cmd`, after
`tool_command` when one is set; claude `Write`
with an absolute `file_path`, opencode `write` with an absolute `filePath`; the working
directory is read from the system prompt's "Working directory:" line); otherwise answer
with a final text message. Each answer carries usage (`input_tokens`, `output_tokens`,
`cached_tokens` per call, configurable; input counts the cached tokens, as OpenAI's APIs do,
and the Anthropic answer splits them into `cache_read_input_tokens`), and the request log
records what was reported.

Modes, global (`mode`) or per API key (`modes[key]`):
- `ok` (default);
- `429`: HTTP 429 with `Retry-After: retry_after` and the provider's error body (a rate
  limit whose message says "Please try again in {retry_after}s"; with `usage_limit_seconds`
  set, the Responses API answers instead as ChatGPT's backend does when a subscription's
  usage limit is reached: `usage_limit_reached` with `resets_at`, now + that many seconds);
- `401`: HTTP 401 with the provider's error body;
- `500`: HTTP 500 with the provider's error body (a server error the CLIs retry);
- `slow`: the final message streams for `slow_seconds`, one text delta every 0.5 s, and on
  until `slow_hold` is set when a test gives one (what it reads while the step runs is then
  read before the answer can end, however busy the machine);
- `hang`: the request is read and never answered (until the server stops).

Rate-limit windows (docs/windows.md §1): `windows[key]` is the 5-hour window's used fraction
for that API key (the weekly one is `weekly_used`), resetting `window_reset_seconds` from
the start; every answer to that key (streams and errors alike) carries the headers the real
backends send: codex's `x-codex-{primary,secondary}-{used-percent,window-minutes,reset-at}`
on the OpenAI APIs, Anthropic's `anthropic-ratelimit-unified-*` (status `allowed`, with the
90 % surpassed threshold `allowed_warning`, at 100 % `rejected`) on the Messages API. With
`window_step` set, each answered model call adds that much to the key's fraction; past 1.0
the key gets 429s (`rejected`, with the headers) until the window resets: every
`window_reset_seconds` from the first use every key's fraction is back to 0 (a short reset
simulates a window that fills and empties within a run, tests/bench/bench_windows.py).

Every request is recorded (`requests`): method, path, the API key it carried (`x-api-key`
or `Authorization: Bearer`), model, mode, time and the usage answered.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.agents.provider_windows import window_headers

# In a system prompt, or (claude) a system reminder in the first user message.
_CWD_RE = re.compile(r"[Ww]orking directory:\s*(/[^\s\"\\<>]*)")


@dataclass
class Request:
    method: str
    path: str
    key: str | None
    model: str | None
    mode: str
    at: float
    api: str | None = None
    answer: str | None = None  # "tool", "text" or None (an error or no answer)
    refused: int | None = None  # the error status answered (429, 401, 500)
    usage: dict[str, int] | None = None
    body: dict[str, Any] | None = None


@dataclass
class ProviderStandIn:
    input_tokens: int = 1200
    output_tokens: int = 40
    cached_tokens: int = 0
    file_name: str = "agent-output.txt"
    file_content: str = "written by the agent\n"
    # codex only: a shell command its tool call runs first (a hostile agent's, say).
    tool_command: str | None = None
    final_text: str = "Done: the file is written."
    retry_after: int = 2
    slow_seconds: float = 4.0
    slow_hold: threading.Event | None = None
    usage_limit_seconds: int | None = None
    mode: str = "ok"
    modes: dict[str, str] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    windows: dict[str, float] = field(default_factory=dict)
    weekly_used: float = 0.17
    window_reset_seconds: int = 3600
    window_step: float = 0.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> ProviderStandIn:
        stand_in = self

        class Handler(_Handler):
            owner = stand_in

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- what the tests read ---------------------------------------------------------------

    def mode_for(self, key: str | None) -> str:
        return self.modes.get(key or "", self.mode)

    def model_calls(self, key: str | None = None) -> list[Request]:
        """The requests that were answered with a model message (tool call or text)."""
        with self._lock:
            return [
                r
                for r in self.requests
                if r.answer is not None and (key is None or r.key == key)
            ]

    def reported(self, key: str | None = None) -> dict[str, int]:
        """Usage answered to `key` (every key when None), summed over the agent's turns:
        the model calls that offered tools (opencode's title request offers none and is not
        in its step usage)."""
        total = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}
        for r in self.model_calls(key):
            if not (r.body or {}).get("tools"):
                continue
            for name in total:
                total[name] += (r.usage or {}).get(name, 0)
        return total

    def keys_seen(self) -> set[str | None]:
        with self._lock:
            return {r.key for r in self.requests if r.method == "POST"}

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _roll(self) -> int:
        """The current window's start (lock held): the first use starts it; once
        `window_reset_seconds` have passed, every key's fraction is back to 0."""
        now = int(time.time())
        started = getattr(self, "_window_epoch", None) or now
        if now >= started + self.window_reset_seconds:
            periods = (now - started) // self.window_reset_seconds
            started += periods * self.window_reset_seconds
            self.windows = dict.fromkeys(self.windows, 0.0)
        self._window_epoch = started
        return started

    def window_reset_at(self) -> int:
        """When the current window resets (epoch seconds)."""
        with self._lock:
            return self._roll() + self.window_reset_seconds

    def window_of(self, key: str | None) -> float | None:
        with self._lock:
            self._roll()
            return self.windows.get(key or "")

    def spend(self, key: str | None) -> None:
        """One answered model call of `key`: its window grows by `window_step`."""
        with self._lock:
            self._roll()
            if self.window_step and key in self.windows:
                self.windows[key] = self.windows[key] + self.window_step

    def window_headers(self, api: str | None, key: str | None) -> dict[str, str]:
        used = self.window_of(key)
        if used is None or api is None:
            return {}
        reset_5h = self.window_reset_at()
        started = reset_5h - self.window_reset_seconds
        reset_7d = started + 7 * 86400
        return window_headers(api, used, self.weekly_used, reset_5h, reset_7d)

    def _usage(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
        }


def _list_field(body: dict[str, Any], key: str) -> list[Any]:
    """`body[key]` when it is a list (a request's input or messages), else []."""
    value = body.get(key)
    return value if isinstance(value, list) else []


def _sse(event: str | None, data: dict[str, Any] | str) -> bytes:
    body = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {body}\n\n".encode()


def _text_of(content: Any) -> str:
    """All text in a message content (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    return ""


class _Handler(BaseHTTPRequestHandler):
    owner: ProviderStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing --------------------------------------------------------------------------

    def _key(self) -> str | None:
        key = self.headers.get("x-api-key")
        if key:
            return key
        auth = self.headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return None

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            value = json.loads(raw or b"{}")
        except ValueError:
            value = {}
        return value if isinstance(value, dict) else {}

    def _json(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        for name, value in self._window_headers().items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _window_headers(self) -> dict[str, str]:
        api = {
            "/v1/responses": "responses",
            "/v1/chat/completions": "chat",
            "/v1/messages": "messages",
        }.get(self.path.split("?", 1)[0])
        return self.owner.window_headers(api, self._key())

    def _stream_start(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        for name, value in self._window_headers().items():
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True

    def _send(self, chunk: bytes) -> None:
        self.wfile.write(chunk)
        self.wfile.flush()

    def _slow_deltas(self, emit: Any) -> None:
        """`slow` mode: text deltas every 0.5 s for `slow_seconds`."""
        deadline = time.monotonic() + self.owner.slow_seconds
        hold = self.owner.slow_hold
        n = 0
        while (
            time.monotonic() < deadline or (hold is not None and not hold.is_set())
        ) and not self.owner._stopping.is_set():
            emit(f"thinking {n} ")
            n += 1
            time.sleep(0.5)

    # -- routes ----------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._record_and(None, {})
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._record_and(None, {})
        self._json(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:
        body = self._body()
        path = self.path.split("?", 1)[0]
        api = {
            "/v1/responses": "responses",
            "/v1/chat/completions": "chat",
            "/v1/messages": "messages",
        }.get(path)
        request = self._record_and(api, body)
        if api is None:
            self._json(404, {"error": {"message": f"no route {path}"}})
            return
        if request.mode == "hang":
            self.close_connection = True
            self.owner._stopping.wait()
            return
        used = self.owner.window_of(request.key)
        if request.mode == "429" or (used is not None and used >= 1.0):
            request.refused = 429
            self._error(api, 429)
            return
        if request.mode in ("401", "500"):
            request.refused = int(request.mode)
            self._error(api, int(request.mode))
            return
        getattr(self, f"_answer_{api}")(body, request)

    def _record_and(self, api: str | None, body: dict[str, Any]) -> Request:
        key = self._key()
        request = Request(
            method=self.command,
            path=self.path,
            key=key,
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            mode=self.owner.mode_for(key),
            at=time.time(),
            api=api,
            body=body,
        )
        self.owner._record(request)
        return request

    def _error(self, api: str, status: int) -> None:
        limited = status == 429
        message = (
            f"Rate limit reached for requests. Please try again in {self.owner.retry_after}s."
            if limited
            else "The server had an error while processing your request."
            if status == 500
            else "Incorrect API key provided."
        )
        headers = {"retry-after": str(self.owner.retry_after)} if limited else {}
        spent = (self.owner.window_of(self._key()) or 0.0) >= 1.0
        if limited and api == "responses" and (self.owner.usage_limit_seconds or spent):
            resets_in = self.owner.usage_limit_seconds or max(
                1, self.owner.window_reset_at() - int(time.time())
            )
            self._json(
                status,
                {
                    "error": {
                        "type": "usage_limit_reached",
                        "message": "The usage limit has been reached",
                        "plan_type": "plus",
                        "resets_at": int(time.time()) + resets_in,
                        "resets_in_seconds": resets_in,
                    }
                },
                headers,
            )
            return
        if api == "messages":
            kind = (
                "rate_limit_error"
                if limited
                else "api_error"
                if status == 500
                else "authentication_error"
            )
            self._json(
                status,
                {"type": "error", "error": {"type": kind, "message": message}},
                headers,
            )
        else:
            kind = (
                "rate_limit_exceeded"
                if limited
                else "server_error"
                if status == 500
                else "invalid_api_key"
            )
            self._json(
                status,
                {
                    "error": {
                        "message": message,
                        "type": "rate_limit_error"
                        if limited
                        else "server_error"
                        if status == 500
                        else "invalid_request_error",
                        "code": kind,
                    }
                },
                headers,
            )

    # -- the script ------------------------------------------------------------------------

    def _plan(
        self, body: dict[str, Any], tool_names: set[str], has_result: bool, tool: str
    ) -> dict[str, str] | None:
        """The tool call to answer with, or None for the final text message."""
        if has_result or tool not in tool_names:
            return None
        match = _CWD_RE.search(json.dumps(body))
        cwd = match.group(1) if match else "."
        return {"cwd": cwd, "path": f"{cwd.rstrip('/')}/{self.owner.file_name}"}

    def _answer_responses(self, body: dict[str, Any], request: Request) -> None:
        items = _list_field(body, "input")
        has_result = any(
            isinstance(i, dict) and i.get("type") == "function_call_output"
            for i in items
        )
        tools = {
            str(t.get("name"))
            for t in body.get("tools") or []
            if isinstance(t, dict) and t.get("name")
        }
        plan = self._plan(body, tools, has_result, "exec_command")
        usage = self.owner._usage()
        request.usage = usage
        request.answer = "tool" if plan else "text"
        self.owner.spend(request.key)
        self._stream_start()
        self._send(
            _sse(
                "response.created",
                {"type": "response.created", "response": {"id": "resp_standin"}},
            )
        )
        if plan:
            cmd = (
                f"printf %s {shlex.quote(self.owner.file_content)} > "
                f"{shlex.quote(self.owner.file_name)}"
            )
            if self.owner.tool_command:
                cmd = f"{self.owner.tool_command}; {cmd}"
            item: dict[str, Any] = {
                "type": "function_call",
                "id": "fc_standin",
                "call_id": "call_standin",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": cmd}),
            }
        else:
            if request.mode == "slow":
                self._send(
                    _sse(
                        "response.output_item.added",
                        {
                            "type": "response.output_item.added",
                            "output_index": 0,
                            "item": {
                                "type": "message",
                                "id": "msg_standin",
                                "role": "assistant",
                                "content": [],
                            },
                        },
                    )
                )
                self._slow_deltas(
                    lambda text: self._send(
                        _sse(
                            "response.output_text.delta",
                            {
                                "type": "response.output_text.delta",
                                "item_id": "msg_standin",
                                "output_index": 0,
                                "content_index": 0,
                                "delta": text,
                            },
                        )
                    )
                )
            item = {
                "type": "message",
                "id": "msg_standin",
                "role": "assistant",
                "content": [{"type": "output_text", "text": self.owner.final_text}],
            }
        self._send(
            _sse(
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": item},
            )
        )
        self._send(
            _sse(
                "response.completed",
                {
                    "type": "response.completed",
                    "response": {
                        "id": "resp_standin",
                        "usage": {
                            "input_tokens": usage["input_tokens"],
                            "input_tokens_details": {
                                "cached_tokens": usage["cached_tokens"]
                            },
                            "output_tokens": usage["output_tokens"],
                            "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": usage["input_tokens"]
                            + usage["output_tokens"],
                        },
                    },
                },
            )
        )

    def _answer_messages(self, body: dict[str, Any], request: Request) -> None:
        messages = _list_field(body, "messages")
        has_result = any(
            isinstance(m, dict)
            and isinstance(m.get("content"), list)
            and any(
                isinstance(b, dict) and b.get("type") == "tool_result"
                for b in m["content"]
            )
            for m in messages
        )
        tools = {
            str(t.get("name"))
            for t in body.get("tools") or []
            if isinstance(t, dict) and t.get("name")
        }
        plan = self._plan(body, tools, has_result, "Write")
        usage = self.owner._usage()
        request.usage = usage
        request.answer = "tool" if plan else "text"
        self.owner.spend(request.key)
        self._stream_start()
        self._send(
            _sse(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_standin",
                        "type": "message",
                        "role": "assistant",
                        "model": request.model or "stub-model",
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        # Anthropic counts cache reads apart from input_tokens.
                        "usage": {
                            "input_tokens": usage["input_tokens"]
                            - usage["cached_tokens"],
                            "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": usage["cached_tokens"],
                            "output_tokens": 1,
                        },
                    },
                },
            )
        )
        if plan:
            block = {
                "type": "tool_use",
                "id": "toolu_standin",
                "name": "Write",
                "input": {},
            }
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps(
                    {"file_path": plan["path"], "content": self.owner.file_content}
                ),
            }
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": self.owner.final_text}
        self._send(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            )
        )
        if not plan and request.mode == "slow":
            self._slow_deltas(
                lambda text: self._send(
                    _sse(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": text},
                        },
                    )
                )
            )
        self._send(
            _sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": delta},
            )
        )
        self._send(
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        )
        self._send(
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": "tool_use" if plan else "end_turn",
                        "stop_sequence": None,
                    },
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        self._send(_sse("message_stop", {"type": "message_stop"}))

    def _answer_chat(self, body: dict[str, Any], request: Request) -> None:
        messages = _list_field(body, "messages")
        has_result = any(
            isinstance(m, dict) and m.get("role") == "tool" for m in messages
        )
        tools = {
            str((t.get("function") or {}).get("name"))
            for t in body.get("tools") or []
            if isinstance(t, dict)
        }
        plan = self._plan(body, tools, has_result, "write")
        usage = self.owner._usage()
        request.usage = usage
        request.answer = "tool" if plan else "text"
        self.owner.spend(request.key)
        model = request.model or "stub-model"

        def chunk(
            delta: dict[str, Any], finish: str | None = None, **extra: Any
        ) -> bytes:
            return _sse(
                None,
                {
                    "id": "chatcmpl-standin",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    **extra,
                },
            )

        self._stream_start()
        if plan:
            self._send(
                chunk(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_standin",
                                "type": "function",
                                "function": {
                                    "name": "write",
                                    "arguments": json.dumps(
                                        {
                                            "filePath": plan["path"],
                                            "content": self.owner.file_content,
                                        }
                                    ),
                                },
                            }
                        ],
                    }
                )
            )
            finish = "tool_calls"
        else:
            self._send(chunk({"role": "assistant", "content": ""}))
            if request.mode == "slow":
                self._slow_deltas(lambda text: self._send(chunk({"content": text})))
            self._send(chunk({"content": self.owner.final_text}))
            finish = "stop"
        self._send(chunk({}, finish))
        self._send(
            _sse(
                None,
                {
                    "id": "chatcmpl-standin",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": usage["input_tokens"],
                        "completion_tokens": usage["output_tokens"],
                        "total_tokens": usage["input_tokens"] + usage["output_tokens"],
                        "prompt_tokens_details": {
                            "cached_tokens": usage["cached_tokens"]
                        },
                    },
                },
            )
        )
        self._send(_sse(None, "[DONE]"))
