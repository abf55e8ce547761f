"""A scripted OpenAI Responses API server for the tests: a real HTTP server on 127.0.0.1
that answers `POST /v1/responses` with a streamed response (server-sent events, as the
API sends them) and `GET /v1/models`, as the test's script says."""

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

__all__ = [
    "MODEL",
    "ResponsesRequest",
    "ScriptedResponses",
    "function_call",
    "message",
    "shell_call",
]

MODEL = "responses-scripted"

Item = dict[str, Any]


@dataclass(frozen=True)
class ResponsesRequest:
    body: dict[str, Any]

    @property
    def tools(self) -> dict[str, Item]:
        return {str(tool.get("name")): tool for tool in self.body.get("tools") or []}

    @property
    def outputs(self) -> list[Item]:
        """The function call outputs sent back so far."""
        return [
            item
            for item in self.body.get("input") or []
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]

    @property
    def text(self) -> str:
        return json.dumps(self.body.get("input"))


def message(text: str) -> Item:
    return {
        "type": "message",
        "id": f"msg_{time.monotonic_ns()}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def shell_call(request: ResponsesRequest, command: str) -> Item:
    """A call of the shell tool the client offers, with arguments as its schema wants."""
    for name in ("exec_command", "shell_command", "shell"):
        tool = request.tools.get(name)
        if tool is None:
            continue
        properties = (tool.get("parameters") or {}).get("properties") or {}
        if "cmd" in properties:
            arguments: dict[str, Any] = {"cmd": command}
        elif (properties.get("command") or {}).get("type") == "array":
            arguments = {"command": ["bash", "-lc", command]}
        else:
            arguments = {"command": command}
        return {
            "type": "function_call",
            "id": f"fc_{time.monotonic_ns()}",
            "call_id": f"call_{time.monotonic_ns()}",
            "name": name,
            "arguments": json.dumps(arguments),
            "status": "completed",
        }
    raise LookupError(f"no shell tool among {sorted(request.tools)}")


def function_call(name: str, arguments: dict[str, Any], *, namespace: str | None = None) -> Item:
    """A call of the function tool `name` (of the tool namespace `namespace`) with
    `arguments`."""
    call = {
        "type": "function_call",
        "id": f"fc_{time.monotonic_ns()}",
        "call_id": f"call_{time.monotonic_ns()}",
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }
    return call if namespace is None else {**call, "namespace": namespace}


Script = Callable[[ResponsesRequest], Item]


def _events(item: Item, model: str) -> bytes:
    response = {
        "id": f"resp_{time.monotonic_ns()}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "in_progress",
        "output": [],
    }
    started = dict(item, status="in_progress")
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
    ]
    if item["type"] == "message":
        started["content"] = []
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        events += [
            {"type": "response.output_item.added", "output_index": 0, "item": started},
            {"type": "response.content_part.added", **where, "part": dict(part, text="")},
            {"type": "response.output_text.delta", **where, "delta": part["text"]},
            {"type": "response.output_text.done", **where, "text": part["text"]},
            {"type": "response.content_part.done", **where, "part": part},
        ]
    else:
        started["arguments"] = ""
        where = {"item_id": item["id"], "output_index": 0}
        events += [
            {"type": "response.output_item.added", "output_index": 0, "item": started},
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {
                "type": "response.function_call_arguments.done",
                **where,
                "arguments": item["arguments"],
            },
        ]
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 10,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 110,
    }
    events += [
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {
            "type": "response.completed",
            "response": dict(response, status="completed", output=[item], usage=usage),
        },
    ]
    return "".join(
        f"event: {event['type']}\ndata: {json.dumps(dict(event, sequence_number=number))}\n\n"
        for number, event in enumerate(events)
    ).encode()


def _ok_response(body: dict[str, Any]) -> dict[str, Any]:
    """A whole (not streamed) response saying OK."""
    said = {"type": "output_text", "text": "OK", "annotations": []}
    item = {"type": "message", "id": "msg_ok", "role": "assistant", "content": [said]}
    return {
        "id": f"resp_{time.monotonic_ns()}",
        "object": "response",
        "status": "completed",
        "model": body.get("model"),
        "output": [item],
        "usage": {"input_tokens": 20, "output_tokens": 1, "total_tokens": 21},
    }


class ScriptedResponses(LocalServer):
    """The server: `script(request)` gives the one output item of each response;
    `requests` keeps what came."""

    def __init__(self, script: Script, *, api_key: str = "sk-responses-scripted-key") -> None:
        self.script = script
        self.api_key = api_key
        self.requests: list[ResponsesRequest] = []
        #: The pre-flight requests (marked by their header), kept apart and answered "OK"
        #: (not streamed, as they ask).
        self.probes: list[ResponsesRequest] = []
        self._lock = threading.Lock()
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(QuietHandler):
            def _send(self, status: int, payload: bytes, kind: str = "application/json") -> None:
                self.send_payload(status, payload, kind)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {server.api_key}":
                    return True
                error = {"error": {"message": "bad key", "type": "invalid_request_error"}}
                self._send(401, json.dumps(error).encode())
                return False

            def do_GET(self) -> None:
                if self.path.rstrip("/") != "/v1/models":
                    self._send(404, b'{"error": {"message": "no route"}}')
                elif self._authorized():
                    listing = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                    self._send(200, json.dumps(listing).encode())

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.split("?")[0].rstrip("/") != "/v1/responses":
                    self._send(404, b'{"error": {"message": "no route"}}')
                    return
                if not self._authorized():
                    return
                request = ResponsesRequest(body)
                if self.headers.get(PREFLIGHT_HEADER):
                    with server._lock:
                        server.probes.append(request)
                    self._send(200, json.dumps(_ok_response(body)).encode())
                    return
                with server._lock:
                    server.requests.append(request)
                item = server.script(request)
                self._send(200, _events(item, str(body.get("model"))), "text/event-stream")

        return Handler
