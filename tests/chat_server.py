"""A real OpenAI-compatible chat-completions server on 127.0.0.1, in a thread, for judge tests.

Every POST to /v1/chat/completions is answered by a script, `script(n, body, headers) -> Reply`,
where n counts requests from 0 (so a test can fail the first attempts and then recover) and
body is the decoded request. The server records what it received and how many requests
were in flight at once; `seen` holds the method, path and headers of every request, a GET
(what urllib makes of a redirected POST) included.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class Reply:
    status: int = 200
    content: str | None = None  # wrapped in a chat-completions body
    raw: bytes | None = None  # sent as it is (a malformed body, an error page)
    delay: float = 0.0  # seconds to wait before answering (a client timeout)
    headers: dict[str, str] = field(default_factory=dict)


def document_of(body: dict[str, Any]) -> str:
    """The document section of a judge prompt."""
    user = body["messages"][-1]["content"]
    return user.split("Document:\n", 1)[1].split("\n\nReference ", 1)[0].split("\n\nQuestion: ", 1)[0]


def output_of(body: dict[str, Any]) -> str:
    """The model's output section of a judge prompt."""
    user = body["messages"][-1]["content"]
    return user.split("Model's ", 1)[1].split(":\n", 1)[1].rsplit("\n\nFirst explain", 1)[0]


def by_marker(marker: str = "zebra") -> Callable[[int, dict, dict], Reply]:
    """A judge that finds an output supported exactly when the document mentions `marker`."""

    def script(n: int, body: dict, headers: dict) -> Reply:
        supported = marker in document_of(body)
        return Reply(content=f"The document {'does' if supported else 'does not'} mention it.\n"
                             f"Conclusion: {supported}")

    return script


def route(request_path: str) -> str:
    """The path a request is answered by: its query (a token some gateways take there) left aside."""
    return urllib.parse.urlsplit(request_path).path.rstrip("/")


class LoopbackServer:
    """An HTTP server on a free port of 127.0.0.1, served by a thread inside the `with` block;
    subclasses give the request handler and record what they receive."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.seen: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers) of every request
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ChatServer(LoopbackServer):
    def __init__(self, script: Callable[[int, dict, dict], Reply] | None = None):
        self.script = script or by_marker()
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        super().__init__(self._handler())

    @property
    def count(self) -> int:
        return len(self.bodies)

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        body = json.loads(raw)
        headers = dict(handler.headers.items())
        with self._lock:
            n = len(self.bodies)
            self.bodies.append(body)
            self.headers.append(headers)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            reply = self.script(n, body, headers)
            time.sleep(reply.delay)
        finally:
            # no longer in flight once answered: the client may send its next request before this
            # thread gets past writing the answer
            with self._lock:
                self.in_flight -= 1
        try:
            payload = reply.raw if reply.raw is not None else json.dumps({
                "id": f"chatcmpl-{n}", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply.content or ""}}],
            }).encode()
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            for key, value in reply.headers.items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout): nothing to answer

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                server.seen.append(("GET", self.path, dict(self.headers.items())))
                self.send_error(404)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                server.seen.append(("POST", self.path, dict(self.headers.items())))
                if route(self.path) != "/v1/chat/completions":
                    self.send_error(404)
                    return
                server._answer(self)

            def log_message(self, *args: object) -> None:
                pass  # keep test output clean

        return Handler


def closed_port_url() -> str:
    """An endpoint on 127.0.0.1 where nothing listens: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
