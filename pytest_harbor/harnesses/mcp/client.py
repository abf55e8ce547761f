"""The granted MCP servers of one turn, connected, for a host-side harness: their tools
listed under the names a model is offered (`mcp__<server>__<tool>`), and calls answered
as text. The connections run on an event loop of their own, in a thread, through the
sandbox (relay.py); a harness calls from its own thread and never waits past a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from pytest_harbor.harnesses.mcp.access import GrantedServer, McpAccess, exposed_tool_name
from pytest_harbor.harnesses.mcp.relay import OpenPipe, PipeTransport, stdio_over_pipe
from pytest_harbor.redaction import Redactor

__all__ = ["McpTool", "McpTools", "ToolAnswer"]

T = TypeVar("T")

#: The longest wait for an SSE stream's next event, and for any other HTTP answer.
_SSE_READ_S = 3600.0
_HTTP_S = 60.0
#: How long closing waits for the connections to end before it leaves them.
_CLOSE_S = 5.0


@dataclass(frozen=True)
class McpTool:
    """One tool of a granted server, as a model is offered it."""

    server: str
    name: str
    exposed: str
    description: str
    parameters: dict[str, Any]

    def definition(self) -> dict[str, Any]:
        """The tool as a Chat Completions function."""
        return {
            "type": "function",
            "function": {
                "name": self.exposed,
                "description": f"[MCP server {self.server}] {self.description}".strip(),
                "parameters": self.parameters or {"type": "object", "properties": {}},
            },
        }


@dataclass(frozen=True)
class ToolAnswer:
    text: str
    is_error: bool


class McpTools:
    """The connections of one turn; `connect()` first, `close()` always."""

    def __init__(self, access: McpAccess, open_pipe: OpenPipe, redactor: Redactor) -> None:
        self.access = access
        self._open_pipe = open_pipe
        self._redactor = redactor
        self.tools: dict[str, McpTool] = {}
        #: Server name -> why it could not be connected.
        self.failures: dict[str, str] = {}
        self._clients: dict[str, Client] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="harbor-mcp", daemon=True
        )
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._holders: list[asyncio.Future[None]] = []

    # ------------------------------------------------------------------ the harness's side

    def connect(self, timeout: float) -> None:
        """Connect every granted server and list its tools, together, within `timeout`
        seconds; a server that fails is named in `failures`."""
        if not self.access.granted:
            return
        with contextlib.suppress(FutureTimeout, TimeoutError):
            self._run(self._connect_all(timeout), timeout + 2.0)
        for server in self.access.granted:
            if server.name not in self._clients and server.name not in self.failures:
                self.failures[server.name] = f"no answer within {timeout:g} s"

    def call(self, exposed: str, arguments: dict[str, Any], timeout: float) -> ToolAnswer:
        tool = self.tools[exposed]
        client = self._clients[tool.server]
        try:
            result = self._run(
                client.call_tool(tool.name, arguments, read_timeout_seconds=timeout),
                timeout + 2.0,
            )
        except (FutureTimeout, TimeoutError):
            return ToolAnswer(f"the tool did not answer within {timeout:g} s", True)
        except Exception as error:  # the server's or the connection's failure, any kind
            if "timed out" in str(error):
                return ToolAnswer(f"the tool did not answer within {timeout:g} s", True)
            return ToolAnswer(f"the call failed: {_describe(error)}", True)
        return ToolAnswer(_text_of(result), bool(getattr(result, "is_error", False)))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            if self._holders:
                waiting = asyncio.run_coroutine_threadsafe(self._wait_holders(), self._loop)
                with contextlib.suppress(Exception):
                    waiting.result(_CLOSE_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSE_S)
        if not self._thread.is_alive():
            self._loop.close()

    # ------------------------------------------------------------------ the loop's side

    def _run(self, work: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    async def _connect_all(self, timeout: float) -> None:
        self._stop = asyncio.Event()
        ready: dict[str, asyncio.Future[Client]] = {}
        for server in self.access.granted:
            ready[server.name] = self._loop.create_future()
            self._holders.append(asyncio.ensure_future(self._hold(server, ready[server.name])))
        done, _ = await asyncio.wait(ready.values(), timeout=timeout)
        taken: set[str] = set()
        for server in self.access.granted:
            future = ready[server.name]
            if future not in done:
                continue
            error = future.exception()
            if error is not None:
                self.failures[server.name] = self._redactor.text(_describe(error))
                continue
            client = future.result()
            try:
                listed = await asyncio.wait_for(_list_tools(client), timeout=timeout)
            except Exception as failure:  # any failure of the listing
                self.failures[server.name] = self._redactor.text(
                    f"listing its tools failed: {_describe(failure)}"
                )
                continue
            self._clients[server.name] = client
            for tool in listed:
                exposed = exposed_tool_name(server.name, tool.name, taken)
                self.tools[exposed] = McpTool(
                    server=server.name,
                    name=tool.name,
                    exposed=exposed,
                    description=tool.description or "",
                    parameters=dict(tool.input_schema or {}),
                )

    async def _hold(self, server: GrantedServer, ready: asyncio.Future[Client]) -> None:
        """One server's connection, open until close()."""
        assert self._stop is not None
        try:
            async with Client(self._transport(server), mode="legacy") as client:
                ready.set_result(client)
                await self._stop.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else RuntimeError())
            if not isinstance(error, Exception):
                raise

    async def _wait_holders(self) -> None:
        await asyncio.wait(self._holders, timeout=_CLOSE_S)

    def _transport(self, server: GrantedServer) -> Any:
        config = server.config
        if config.transport == "stdio":
            assert config.command is not None
            return stdio_over_pipe(self._open_pipe([config.command, *config.args]))
        url = config.url or ""
        headers = dict(server.headers)
        if config.transport == "sse":

            def factory(
                headers: dict[str, Any] | None = None,
                timeout: httpx2.Timeout | None = None,
                auth: httpx2.Auth | None = None,
            ) -> httpx2.AsyncClient:
                return httpx2.AsyncClient(
                    transport=PipeTransport(self._open_pipe),
                    headers=headers,
                    timeout=timeout or httpx2.Timeout(_HTTP_S, read=_SSE_READ_S),
                    auth=auth,
                )

            return sse_client(
                url,
                headers=headers,
                timeout=_HTTP_S,
                sse_read_timeout=_SSE_READ_S,
                httpx_client_factory=factory,
            )
        client = httpx2.AsyncClient(
            transport=PipeTransport(self._open_pipe),
            headers=headers,
            timeout=httpx2.Timeout(_HTTP_S, read=_SSE_READ_S),
        )
        return streamable_http_client(url, http_client=client)


async def _list_tools(client: Client) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _text_of(result: Any) -> str:
    """A tool's result as the text a model reads."""
    parts: list[str] = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(str(getattr(item, "text", "")))
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} content, {getattr(item, 'mime_type', '?')}]")
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def _describe(error: BaseException) -> str:
    """An exception as one line, the innermost of an exception group."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
