"""A scripted OpenAI-compatible model server for the tests: a real HTTP server on 127.0.0.1
that speaks Chat Completions (tool calls, `usage`, error bodies, `Retry-After`; streamed when
the request asks for it) and answers each request as the test's script says."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal

from pytest_harbor.harnesses.model_request import PREFLIGHT_HEADER
from tests.local_server import LocalServer, QuietHandler

__all__ = [
    "VLLM_NO_TOOLS",
    "ChatRequest",
    "Reply",
    "Script",
    "ScriptedModel",
    "answer",
    "error",
    "no_tool_parser",
    "tool_call",
]

MODEL = "scripted-model"
#: What vLLM answers a request with `tool_choice: "auto"` when it was served without
#: --enable-auto-tool-choice (its words and the shape of its error body).
VLLM_NO_TOOLS = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
#: Ways the server can be broken, whatever the script says: `no-tool-parser` answers every
#: request offering tools as vLLM without tool calling does; `500` answers every request
#: with a server error.
Broken = Literal["no-tool-parser", "500"]


@dataclass(frozen=True)
class Reply:
    """What the server sends back for one request."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Wait this long before answering (a slow or hanging endpoint).
    delay_s: float = 0.0
    #: Send this instead of JSON (a broken endpoint).
    raw: bytes | None = None


def _completion(message: dict[str, Any], finish: str, usage: tuple[int, int]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
    }


def tool_call(
    command: str | None = None,
    *,
    timeout_sec: int | None = None,
    raw_arguments: str | None = None,
    content: str | None = None,
    usage: tuple[int, int] = (100, 20),
    calls: list[dict[str, Any]] | None = None,
) -> Reply:
    """A response calling `bash` (or, with `raw_arguments`, sending those as they are)."""
    if calls is None:
        arguments: dict[str, Any] = {"command": command}
        if timeout_sec is not None:
            arguments["timeout_sec"] = timeout_sec
        calls = [
            {
                "id": f"call_{time.monotonic_ns()}",
                "type": "function",
                "function": {
                    "name": "bash",
                    "arguments": raw_arguments
                    if raw_arguments is not None
                    else json.dumps(arguments),
                },
            }
        ]
    message = {"role": "assistant", "content": content, "tool_calls": calls}
    return Reply(body=_completion(message, "tool_calls", usage))


def answer(text: str, *, usage: tuple[int, int] = (120, 10)) -> Reply:
    """A response without a tool call: it ends the agent's turn."""
    return Reply(body=_completion({"role": "assistant", "content": text}, "stop", usage))


def error(
    status: int,
    message: str,
    *,
    code: str | None = None,
    retry_after: str | None = None,
    kind: str = "invalid_request_error",
) -> Reply:
    """An OpenAI-style error body."""
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Reply(status=status, body=body, headers=headers)


def no_tool_parser() -> Reply:
    """vLLM's answer to a request offering tools when it was served without tool calling."""
    body = {
        "object": "error",
        "message": VLLM_NO_TOOLS,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    return Reply(status=400, body=body)


@dataclass(frozen=True)
class ChatRequest:
    """One Chat Completions request as the server received it."""

    number: int
    body: dict[str, Any]
    headers: dict[str, str]
    at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def last(self) -> dict[str, Any]:
        return self.messages[-1]

    @property
    def instructions(self) -> list[str]:
        """Every user message, in order."""
        return [m["content"] for m in self.messages if m.get("role") == "user"]

    @property
    def tool_results(self) -> list[str]:
        return [m["content"] for m in self.messages if m.get("role") == "tool"]

    @property
    def since_last_user(self) -> list[dict[str, Any]]:
        """The messages after the latest user message (this turn's exchanges)."""
        messages = self.messages
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        return messages[last_user + 1 :]


Script = Callable[[ChatRequest], Reply]


def _chunks(completion: dict[str, Any], with_usage: bool) -> list[dict[str, Any]]:
    """A chat.completion as the chunks of its stream: the role and text, each tool call
    (its id and name, then its arguments), the finish reason, and the usage if asked."""
    choice = completion["choices"][0]
    message = choice["message"]
    base = {key: completion[key] for key in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": message.get("content") or ""})]
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        head = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk(
                {"tool_calls": [{**head, "function": {"name": function["name"], "arguments": ""}}]}
            )
        )
        chunks.append(
            chunk(
                {"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]}
            )
        )
    chunks.append(chunk({}, choice["finish_reason"]))
    if with_usage:
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return chunks


class ScriptedModel(LocalServer):
    """The server: `script(request)` decides every answer; `requests` keeps what came."""

    def __init__(
        self,
        script: Script,
        *,
        api_key: str | None = "sk-scripted-test-key",
        model: str = MODEL,
        broken: Broken | None = None,
    ) -> None:
        self.script = script
        self.api_key = api_key
        #: The one model the server lists.
        self.model = model
        self.broken = broken
        self.requests: list[ChatRequest] = []
        #: The pre-flight requests (marked by their header), kept apart and answered "OK"
        #: unless the server is broken: a test's script sees the agent's requests only.
        self.probes: list[ChatRequest] = []
        self.model_list_requests = 0
        self._lock = threading.Lock()
        super().__init__()

    def options(self, *extra: str) -> list[str]:
        """The pytest options that point shell-agent at this server."""
        return [
            "--harbor-agent=shell-agent",
            f"--harbor-model={self.model}",
            f"--harbor-model-url={self.url}",
            *extra,
        ]

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> ChatRequest:
        with self._lock:
            request = ChatRequest(len(self.requests), body, headers, time.monotonic())
            self.requests.append(request)
        return request

    def breakage(self, body: dict[str, Any]) -> Reply | None:
        """The answer of a broken server to a request with `body` (None: not broken)."""
        if self.broken == "500":
            return error(500, "Internal Server Error", kind="InternalServerError")
        if self.broken == "no-tool-parser" and body.get("tools"):
            return no_tool_parser()
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(QuietHandler):
            def _authorized(self) -> bool:
                # A test of the key's way may give any key; the rest check it.
                wanted = f"Bearer {server.api_key}"
                if server.api_key is None or self.headers.get("Authorization") == wanted:
                    return True
                self._send(error(401, "Incorrect API key provided.", code="invalid_api_key"))
                return False

            def do_GET(self) -> None:
                if self.path.rstrip("/") != "/v1/models":
                    self._send(error(404, f"no route {self.path}"))
                    return
                server.model_list_requests += 1
                if self._authorized():
                    listing = {"object": "list", "data": [{"id": server.model, "object": "model"}]}
                    self._send(Reply(body=listing))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(error(404, f"no route {self.path}"))
                    return
                if not self._authorized():
                    return
                body = json.loads(data)
                if self.headers.get(PREFLIGHT_HEADER):
                    server.probes.append(
                        ChatRequest(-1, body, dict(self.headers), time.monotonic())
                    )
                    self._send(server.breakage(body) or answer("OK", usage=(20, 1)))
                    return
                request = server._record(body, dict(self.headers.items()))
                reply = server.breakage(body) or server.script(request)
                if request.body.get("stream") and reply.status == 200 and reply.raw is None:
                    self._stream(
                        reply, bool((request.body.get("stream_options") or {}).get("include_usage"))
                    )
                else:
                    self._send(reply)

            def _stream(self, reply: Reply, with_usage: bool) -> None:
                """The completion as `stream: true` sends it: chunks, then [DONE]."""
                payload = (
                    b"".join(
                        f"data: {json.dumps(chunk)}\n\n".encode()
                        for chunk in _chunks(reply.body, with_usage)
                    )
                    + b"data: [DONE]\n\n"
                )
                self.send_payload(200, payload, "text/event-stream")

            def _send(self, reply: Reply) -> None:
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                self.send_payload(reply.status, payload, headers=reply.headers)

        return Handler
