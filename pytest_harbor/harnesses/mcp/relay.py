"""The way an agent's MCP connections go: through the sandbox, so that they reach what
the agent in the sandbox reaches (a Compose sidecar by its service name, a server on the
sandbox's own loopback, the hosts of its allow-list) and nothing else.

An HTTP connection is the engine's own busybox `nc` in the sandbox, run as the agent
user, its input and output joined to this process (a sandbox Pipe); HTTP, and TLS for
`https`, are spoken over it here. A stdio server is its command in the sandbox, run the
same way, one JSON-RPC message a line.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import httpcore2
import httpx2
import mcp_types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from anyio.streams.tls import TLSStream
from mcp.shared.message import SessionMessage

from pytest_harbor.sandboxes.base import TRUSTED_BUSYBOX, SandboxError
from pytest_harbor.sandboxes.pipes import Pipe

__all__ = ["OpenPipe", "PipeTransport", "stdio_over_pipe"]

#: Starts a command in the sandbox with its input and output joined to this process.
OpenPipe = Callable[[Sequence[str]], Pipe]

#: How long one read waits before it looks again whether it was cancelled.
_POLL_S = 0.5
#: The most one answer of a server may hold (an SSE stream counts as one answer): a
#: server is the task's code, and what it sends is held in this process's memory.
MOST_ANSWER_BYTES = 64 * 1024 * 1024


class _PipeBytes(anyio.abc.ByteStream):
    """A pipe as an anyio byte stream (reads and writes in worker threads)."""

    def __init__(self, pipe: Pipe) -> None:
        self._pipe = pipe

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            try:
                chunk = await anyio.to_thread.run_sync(self._pipe.receive, _POLL_S)
            except TimeoutError:
                continue
            if not chunk:
                raise anyio.EndOfStream
            return chunk

    async def send(self, item: bytes) -> None:
        try:
            await anyio.to_thread.run_sync(self._pipe.send, bytes(item))
        except SandboxError as error:
            raise anyio.BrokenResourceError(str(error)) from None

    async def send_eof(self) -> None:
        pass  # a pipe's input ends only with the pipe

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._pipe.close)


class _NetworkStream(httpcore2.AsyncNetworkStream):
    """An anyio byte stream as httpcore2 reads and writes it; TLS on request."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if not self._buffer:
            try:
                with anyio.fail_after(timeout):
                    self._buffer = await self._stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return b""
            except TimeoutError:
                raise httpcore2.ReadTimeout(f"no answer within {timeout:g} s") from None
        chunk, self._buffer = self._buffer[:max_bytes], self._buffer[max_bytes:]
        return chunk

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            with anyio.fail_after(timeout):
                await self._stream.send(buffer)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as error:
            raise httpcore2.WriteError(str(error)) from None

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                wrapped = await TLSStream.wrap(
                    self._stream,
                    hostname=server_hostname,
                    ssl_context=ssl_context,
                    standard_compatible=False,
                )
        except (OSError, ssl.SSLError, anyio.EndOfStream, TimeoutError) as error:
            raise httpcore2.ConnectError(f"TLS failed: {error}") from None
        return _NetworkStream(wrapped)

    def get_extra_info(self, info: str) -> Any:
        return None


class _PipeBackend(httpcore2.AsyncNetworkBackend):
    """Every TCP connection is `nc HOST PORT` in the sandbox."""

    def __init__(self, open_pipe: OpenPipe) -> None:
        self._open_pipe = open_pipe

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        command = [TRUSTED_BUSYBOX, "nc", host, str(port)]
        try:
            pipe = await anyio.to_thread.run_sync(self._open_pipe, command)
        except SandboxError as error:
            raise httpcore2.ConnectError(str(error)) from None
        return _NetworkStream(_PipeBytes(pipe))

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("MCP servers are reached by URL, not by socket path")

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class _ResponseBody(httpx2.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        try:
            async for part in self._stream:
                read += len(part)
                if read > MOST_ANSWER_BYTES:
                    raise httpx2.ReadError(
                        f"the server's answer passed {MOST_ANSWER_BYTES} bytes: not read further"
                    )
                yield part
        except httpcore2.TimeoutException as error:
            raise httpx2.ReadTimeout(str(error)) from None
        except httpcore2.NetworkError as error:
            raise httpx2.ReadError(str(error)) from None
        except httpcore2.ProtocolError as error:
            raise httpx2.RemoteProtocolError(str(error)) from None

    async def aclose(self) -> None:
        closing = getattr(self._stream, "aclose", None)
        if closing is not None:
            await closing()


class PipeTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport whose connections are opened in the sandbox (see the module)."""

    def __init__(self, open_pipe: OpenPipe) -> None:
        self._pool = httpcore2.AsyncConnectionPool(
            network_backend=_PipeBackend(open_pipe), http1=True, http2=False
        )

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        core = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            answer = await self._pool.handle_async_request(core)
        except httpcore2.ConnectError as error:
            raise httpx2.ConnectError(str(error), request=request) from None
        except httpcore2.TimeoutException as error:
            raise httpx2.ReadTimeout(str(error), request=request) from None
        except (httpcore2.NetworkError, httpcore2.ProtocolError) as error:
            raise httpx2.ReadError(str(error), request=request) from None
        return httpx2.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_ResponseBody(answer.stream),
            extensions=answer.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


@contextlib.asynccontextmanager
async def stdio_over_pipe(
    pipe: Pipe,
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """MCP's stdio transport (an mcp.client.Transport) over a command already running in
    the sandbox."""
    bytes_in = _PipeBytes(pipe)
    reader_in, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, writer_out = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_lines() -> None:
        buffer = b""
        async with reader_in:
            while True:
                try:
                    chunk = await bytes_in.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                lines = (buffer + chunk).split(b"\n")
                buffer = lines.pop()
                if len(buffer) > MOST_ANSWER_BYTES:
                    await reader_in.send(
                        ValueError(f"a line of the server passed {MOST_ANSWER_BYTES} bytes")
                    )
                    return
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        message = mcp_types.jsonrpc_message_adapter.validate_json(
                            line, by_name=False
                        )
                    except ValueError as error:
                        await reader_in.send(error)
                        continue
                    await reader_in.send(SessionMessage(message))

    async def write_lines() -> None:
        async with writer_out:
            async for message in writer_out:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await bytes_in.send(data.encode() + b"\n")

    async with anyio.create_task_group() as group:
        group.start_soon(read_lines)
        group.start_soon(write_lines)
        try:
            yield read_stream, write_stream
        finally:
            await bytes_in.aclose()
            group.cancel_scope.cancel()
