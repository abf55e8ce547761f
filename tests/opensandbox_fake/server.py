"""FakeOpenSandbox: its start and stop, the API key, and the routing of each request
to the lifecycle API or, behind the proxy path, to execd."""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qsl, unquote, urlsplit

import docker
import docker.errors

from tests.opensandbox_fake.egress import EGRESS_PORT
from tests.opensandbox_fake.execd import _Commands
from tests.opensandbox_fake.faults import Fault, Faults, cut
from tests.opensandbox_fake.files import _Files
from tests.opensandbox_fake.lifecycle import _Lifecycle
from tests.opensandbox_fake.pty import _Ptys, _PtySession
from tests.opensandbox_fake.records import _Command, _Sandbox
from tests.opensandbox_fake.websocket import ServerWebSocket
from tests.opensandbox_fake.wire import (
    GO_JSON,
    _error,
    _go_json,
    _Handler,
    _HttpError,
    _not_found,
    _SandboxGone,
    _starlette_json,
)

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
EXECD_TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
EXECD_TOKEN_ENV = "EXECD_ACCESS_TOKEN"
EXECD_PORT = 44772

_PROXY_PATH = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/proxy/(\d+)(/.*)?$")
_COMMAND_STATUS = re.compile(r"^/command/status/([^/]+)$")
_COMMAND_LOGS = re.compile(r"^/command/([^/]+)/logs$")


class FakeOpenSandbox(_Lifecycle, _Commands, _Files, _Ptys):
    """An OpenSandbox server (Docker runtime, bridge network, server-proxied execd) on
    127.0.0.1, serving from a thread of its own between start() and stop().

    `min_timeout_s` is the smallest `timeout` create accepts: 60 on the real server; a
    test lowers it to see expiry happen without waiting a minute. `max_creating` caps
    the creates under way at once, as a hosted server's limit does (429 past it)."""

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        api_key: str = "test-key",
        grace_s: float = 1.0,
        min_timeout_s: int = 60,
        max_creating: int | None = None,
        egress_mode: str | None = None,
    ) -> None:
        self.domain = ""
        self.requests: list[tuple[str, str]] = []
        self._client = client
        self._api_key = api_key
        self._grace_s = grace_s
        self._min_timeout_s = min_timeout_s
        self._instance = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._sandboxes: dict[str, _Sandbox] = {}
        self._commands: dict[str, _Command] = {}
        self._ptys: dict[str, _PtySession] = {}
        self._websockets: set[ServerWebSocket] = set()
        self._expirations: dict[str, datetime] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        #: Failures served on purpose (inject()).
        self.faults = Faults()
        #: Creates under way at once past which one is refused (429); how many are, the
        #: most there were, and how many were refused.
        self.max_creating = max_creating
        #: The egress sidecar's mode ("dns+nft", "dns"); None: no egress image, so a
        #: networkPolicy is refused.
        self.egress_mode = egress_mode
        self.creating = 0
        self.most_creating = 0
        self.refused_creates = 0

    # -- life of the fake ----------------------------------------------------------------

    def start(self) -> None:
        """Serves on a free port of 127.0.0.1 from a background thread."""

        class Handler(_Handler):
            pass

        Handler.fake = self
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.domain = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops serving, cancels the expiry timers, cuts the terminal sessions'
        WebSockets and removes every container it made (with their shells)."""
        with self._lock:
            timers = list(self._timers.values())
            self._timers.clear()
        for timer in timers:
            timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._end_ptys()
        for container in self.sandbox_containers():
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True)
        self._sandboxes.clear()

    def inject(self, fault: Fault) -> Fault:
        """`fault` is served to the requests it matches (its `served` counts them)."""
        return self.faults.add(fault)

    # -- routing ---------------------------------------------------------------------------

    def _serve(self, handler: _Handler, body: bytes) -> None:
        url = urlsplit(handler.path)
        path = unquote(url.path)
        query = parse_qsl(url.query, keep_blank_values=True)
        method = handler.command
        self.requests.append((method, path))
        proxy = _PROXY_PATH.match(path)
        # The proxy route is exempt from the API key (middleware/auth.py), unless it tries "..".
        if proxy and ".." not in path:
            self._serve_execd(handler, proxy[1], int(proxy[2]), proxy[3] or "/", query, body)
            return
        if path.startswith("/health"):
            if path == "/health" and method == "GET":
                handler.reply(200, b'{"status":"healthy"}')
            else:
                handler.reply(404, b'{"detail":"Not Found"}')
            return
        request_id = {"X-Request-ID": uuid.uuid4().hex}
        try:
            self._check_api_key(handler)
            status, answer = self._route_lifecycle(method, path, query, body)
        except _HttpError as error:
            payload = error.body if isinstance(error.body, dict) else {"detail": error.body}
            handler.reply(error.status, _starlette_json(payload), headers=request_id)
            return
        encoded = b"" if answer is None else _starlette_json(answer)
        handler.reply(status, encoded, headers=request_id)

    def _check_api_key(self, handler: _Handler) -> None:
        given = handler.headers.get(API_KEY_HEADER)
        if not given:
            raise _error(
                401,
                "MISSING_API_KEY",
                "Authentication credentials are missing. "
                f"Provide API key via {API_KEY_HEADER} header.",
            )
        if given != self._api_key:
            raise _error(
                401,
                "INVALID_API_KEY",
                "Authentication credentials are invalid. Check your API key and try again.",
            )

    # -- execd -----------------------------------------------------------------------------

    def _serve_execd(
        self,
        handler: _Handler,
        sandbox_id: str,
        port: int,
        rest: str,
        query: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        sandbox = self._sandboxes.get(sandbox_id)
        try:
            container = self._client.containers.get(sandbox.container_id) if sandbox else None
        except docker.errors.NotFound:
            container = None
        if sandbox is None or container is None:
            raise _not_found(sandbox_id)
        if port == EGRESS_PORT and sandbox.egress_token and container.status == "running":
            self._serve_egress(handler, sandbox, handler.command, rest, body)
            return
        if port != EXECD_PORT or container.status != "running":
            address = (container.attrs.get("NetworkSettings") or {}).get("IPAddress") or ""
            raise _error(
                502,
                "GENERAL::UNKNOWN_ERROR",
                f"Could not connect to the backend sandbox {address}:{port}: "
                "All connection attempts failed",
            )
        token = sandbox.env.get(EXECD_TOKEN_ENV, "")
        if token and handler.headers.get(EXECD_TOKEN_HEADER) != token:
            message = f"Unauthorized: invalid or missing header {EXECD_TOKEN_HEADER}"
            handler.reply(401, _go_json({"error": message}), GO_JSON)
            return
        method = handler.command
        try:
            self._route_execd(handler, sandbox, method, rest, query, body)
        except _SandboxGone:
            # The container went away under the request: execd died with it.
            handler.close_connection = True
            if not handler.answered:
                message = f"Could not connect to the backend sandbox {sandbox_id}"
                handler.reply(
                    502, _starlette_json({"code": "GENERAL::UNKNOWN_ERROR", "message": message})
                )
        except _HttpError as error:
            if handler.answered:
                raise
            if isinstance(error.body, str):
                handler.reply(error.status, error.body.encode(), "text/plain; charset=utf-8")
            else:
                handler.reply(error.status, _go_json(error.body), GO_JSON)

    def _route_execd(
        self,
        handler: _Handler,
        sandbox: _Sandbox,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        simple: dict[tuple[str, str], Callable[[], bytes | None]] = {
            ("GET", "/ping"): lambda: None,
            ("DELETE", "/command"): lambda: self._interrupt(sandbox, query),
            ("GET", "/files/info"): lambda: self._files_info(sandbox, query),
            ("DELETE", "/files"): lambda: self._delete_files(sandbox, query),
            ("POST", "/directories"): lambda: self._make_directories(sandbox, body),
            ("DELETE", "/directories"): lambda: self._delete_directories(sandbox, query),
            ("POST", "/files/upload"): lambda: self._upload(sandbox, handler, body),
        }
        if (method, path) in simple:
            answer = simple[method, path]()
            handler.reply(200, answer or b"", GO_JSON if answer else None)
            return
        status = _COMMAND_STATUS.match(path)
        logs = _COMMAND_LOGS.match(path)
        if (method, path) == ("POST", "/command"):
            self._run(handler, sandbox, body)
        elif (method, path) == ("GET", "/files/download"):
            self._download(handler, sandbox, query)
        elif method == "GET" and status:
            fault = self.faults.take("status", status[1])
            if fault is not None and fault.action == "cut":
                cut(handler.connection)
                handler.close_connection = True
                return
            if fault is not None:
                time.sleep(fault.seconds)
            command = self._commands.get(status[1])
            if command is None:
                raise _invalid_body_404(status[1])
            handler.reply(200, _go_json(command.status()), GO_JSON)
        elif method == "GET" and logs:
            self._logs(handler, sandbox, logs[1], query)
        elif path == "/pty" or path.startswith("/pty/"):
            self._serve_pty(handler, sandbox, method, path, query, body)
        else:
            handler.reply(404, b"404 page not found", "text/plain")


def _invalid_body_404(command_id: str) -> _HttpError:
    return _error(404, "INVALID_REQUEST_BODY", f"command not found: {command_id}")
