"""What the scripted model servers share: a real HTTP server on 127.0.0.1, served from a
thread of its own while the `with` block lasts, and a way to send a whole answer."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["LocalServer", "QuietHandler"]


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1, no request log, answers sent at once (headers and body go out as separate
    writes: without TCP_NODELAY, Nagle's algorithm and the client's delayed ACK hold each
    answer back about 40 ms)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_payload(
        self,
        status: int,
        payload: bytes,
        kind: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the client gave up waiting


class LocalServer:
    """Serves `_handler()` on 127.0.0.1 (a free port) from `with` to its end; `url` is the
    base URL ending in /v1."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
