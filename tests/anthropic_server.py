"""A scripted Anthropic Messages API server for the tests: a real HTTP server on 127.0.0.1
that answers `POST /v1/messages` with a streamed (server-sent events) or plain message, and
`GET /v1/models`, as the test's script says. It checks the key in `x-api-key`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from pytest_harbor.harnesses.model_request import PREFLIGHT_HEADER
from tests.local_server import LocalServer, QuietHandler

__all__ = ["MODEL", "MessagesRequest", "ScriptedMessages", "bash", "text", "use"]

MODEL = "claude-scripted"

Block = dict[str, Any]


def text(words: str) -> tuple[list[Block], str]:
    """An answer that ends the turn."""
    return [{"type": "text", "text": words}], "end_turn"


def bash(command: str) -> tuple[list[Block], str]:
    """An answer calling the `Bash` tool."""
    call = {
        "type": "tool_use",
        "id": f"toolu_{time.monotonic_ns()}",
        "name": "Bash",
        "input": {"command": command, "description": "run it"},
    }
    return [call], "tool_use"


def use(name: str, arguments: dict[str, Any]) -> tuple[list[Block], str]:
    """An answer calling the tool `name` with `arguments`."""
    call = {
        "type": "tool_use",
        "id": f"toolu_{time.monotonic_ns()}",
        "name": name,
        "input": arguments,
    }
    return [call], "tool_use"


@dataclass(frozen=True)
class MessagesRequest:
    body: dict[str, Any]
    path: str

    @property
    def tools(self) -> list[str]:
        return [str(tool.get("name")) for tool in self.body.get("tools") or []]

    @property
    def tool_results(self) -> list[Block]:
        return [
            block
            for message in self.body.get("messages") or []
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]

    @property
    def text(self) -> str:
        return json.dumps(self.body.get("messages"))


Script = Callable[[MessagesRequest], tuple[list[Block], str]]


def _events(blocks: list[Block], stop: str, model: str) -> bytes:
    usage = {"input_tokens": 100, "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{time.monotonic_ns()}",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            },
        )
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 20},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


class ScriptedMessages(LocalServer):
    """The server: `script(request)` gives each answer's blocks and stop reason;
    `requests` keeps what came."""

    def __init__(self, script: Script, *, api_key: str = "sk-ant-scripted-test-key") -> None:
        self.script = script
        self.api_key = api_key
        self.requests: list[MessagesRequest] = []
        #: The pre-flight requests (marked by their header), kept apart and answered "OK".
        self.probes: list[MessagesRequest] = []
        self._lock = threading.Lock()
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(QuietHandler):
            def _send(self, status: int, payload: bytes, kind: str = "application/json") -> None:
                self.send_payload(status, payload, kind)

            def _error(self, status: int, kind: str, message: str) -> None:
                body = {"type": "error", "error": {"type": kind, "message": message}}
                self._send(status, json.dumps(body).encode())

            def _authorized(self) -> bool:
                if self.headers.get("x-api-key") == server.api_key:
                    return True
                self._error(401, "authentication_error", "invalid x-api-key")
                return False

            def do_GET(self) -> None:
                if self.path.split("?")[0].rstrip("/") != "/v1/models":
                    self._error(404, "not_found_error", f"no route {self.path}")
                elif self._authorized():
                    listing = {"data": [{"id": MODEL, "type": "model"}], "has_more": False}
                    self._send(200, json.dumps(listing).encode())

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0].rstrip("/")
                if not self._authorized():
                    return
                if path == "/v1/messages/count_tokens":
                    self._send(200, b'{"input_tokens": 100}')
                    return
                if path != "/v1/messages":
                    self._error(404, "not_found_error", f"no route {self.path}")
                    return
                request = MessagesRequest(body, self.path)
                probe = bool(self.headers.get(PREFLIGHT_HEADER))
                with server._lock:
                    (server.probes if probe else server.requests).append(request)
                blocks, stop = text("OK") if probe else server.script(request)
                model = str(body.get("model") or MODEL)
                if body.get("stream"):
                    self._send(200, _events(blocks, stop, model), "text/event-stream")
                    return
                message = {
                    "id": f"msg_{time.monotonic_ns()}",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": blocks,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 100, "output_tokens": 20},
                }
                self._send(200, json.dumps(message).encode())

        return Handler
