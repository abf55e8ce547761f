"""The relay's process: between every harness of a run and the model endpoint.

Started by the run (relay/control.py) with its `RelayStart` on its input, it listens on
127.0.0.1 for harnesses on this machine (and on the addresses the run's engines reach it
at, as it is asked), and on a Unix socket for the run's processes. A call must carry a
token the run granted to an episode: the relay puts the real key in its place, counts
what the answer says it took, prices it, keeps it for a replay, and stops serving once
the run's budget is spent. It ends when its input closes (the run ended, or died).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_harbor.redaction import Redactor
from pytest_harbor.relay.cassettes import Cassette, Recorded, cassette_path, request_key
from pytest_harbor.relay.ledger import Budget, Grant, Ledger
from pytest_harbor.relay.prices import PriceTable, default_prices, load_prices
from pytest_harbor.relay.reports import Counts, GrantRequest, RelayStart
from pytest_harbor.relay.upstream import AUTH_HEADERS, Connection, Upstream
from pytest_harbor.relay.usage import (
    Api,
    CallUsage,
    StreamUsage,
    api_of,
    include_usage_in_stream,
    model_of_request,
    usage_of_body,
    verdict,
)
from pytest_harbor.relay.wire import (
    BODY_CAP,
    HEAD_CAP,
    Head,
    WireError,
    body_chunks,
    read_body,
    read_head,
    write_chunk,
    write_head,
)

__all__ = ["Relay", "main"]

#: What a refusal of the relay's own says it is (the `type` of its JSON error).
BUDGET_SPENT = "budget_exhausted"
REPLAY_MISS = "replay_miss"
#: The most of an answer kept to count (a whole JSON answer) or to record.
_ANSWER_CAP = BODY_CAP
_JSON = [("content-type", "application/json")]


def _error(status: int, kind: str, message: str) -> tuple[int, bytes]:
    body = {"type": "error", "error": {"type": kind, "message": f"pytest-harbor relay: {message}"}}
    return status, json.dumps(body).encode()


class Relay:
    """One run's relay (see the module's docstring)."""

    def __init__(self, start: RelayStart, prices: PriceTable) -> None:
        self.start = start
        self.prices = prices
        self.ledger = Ledger(Budget(start.max_cost_usd, start.max_tokens))
        self.upstream = Upstream(start.upstream, start.api_key)
        self.redactor = Redactor([start.api_key] if start.api_key else []).adding(start.masked)
        self._cassettes: dict[str, Cassette] = {}
        self._servers: dict[str, asyncio.base_events.Server] = {}
        self.port = 0

    # ------------------------------------------------------------------ listening

    async def listen(self, address: str) -> int:
        """Serve harnesses on `address` too (on the relay's port when it is free there);
        the port it serves on."""
        if address in self._servers:
            return self._servers[address].sockets[0].getsockname()[1]  # type: ignore[no-any-return]
        for port in (self.port, 0) if self.port else (0,):
            try:
                server = await asyncio.start_server(
                    self._serve_model, address, port, limit=HEAD_CAP
                )
                break
            except OSError:
                if port == 0:
                    raise
        self._servers[address] = server
        bound: int = server.sockets[0].getsockname()[1]
        if not self.port:
            self.port = bound
        return bound

    async def serve_control(self, path: str) -> asyncio.base_events.Server:
        return await asyncio.start_unix_server(self._serve_control, path, limit=HEAD_CAP)

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self.upstream.close()

    # ------------------------------------------------------------------ model calls

    async def _serve_model(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                head = await read_head(reader, answer=False)
                if head is None:
                    return
                body = await read_body(reader, head)
                kept = await self._answer(head, body, writer)
                await writer.drain()
                if not kept or not head.keep_alive:
                    return
        except (WireError, ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            return
        finally:
            writer.close()

    async def _answer(self, head: Head, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection cannot carry another."""
        used, token = _token_of(head)
        grant = self.ledger.find(token)
        if grant is None:
            return _send(writer, *_error(401, "authentication_error", "unknown or ended token"))
        api = api_of(head.target)
        if api is not None:
            model = model_of_request(body)
            if not grant.allows(model):
                grant.note(grant.refused, f"a call of the model {model!r}")
                return _send(
                    writer,
                    *_error(
                        403,
                        "permission_error",
                        f"this token is for the model {grant.request.models[0]!r} only",
                    ),
                )
            reached = self.ledger.budget.reached(self.ledger.spent)
            if reached is not None:
                grant.refused_for_budget += 1
                return _send(writer, *_error(402, BUDGET_SPENT, f"the run's budget: {reached}"))
        kept = self.start.record is not None or self.start.replay is not None
        key = request_key(head.method, head.target, body) if kept else ""
        if self.start.replay is not None:
            return self._replay(grant, head, api, key, writer)
        return await self._forward(grant, head, body, api, used, key, writer)

    def _replay(
        self, grant: Grant, head: Head, api: Api | None, key: str, writer: asyncio.StreamWriter
    ) -> bool:
        recorded = self._cassette(grant).answer(key)
        if recorded is None:
            what = f"{head.method} {head.target.split('?', 1)[0]} (key {key})"
            grant.note(grant.replay_misses, what)
            return _send(writer, *_error(424, REPLAY_MISS, f"no answer was recorded for {what}"))
        self._settle(grant, api, recorded.status, recorded.content_type, recorded.body)
        headers = [("content-type", recorded.content_type)]
        write_head(writer, Head(status=recorded.status, headers=headers), length=len(recorded.body))
        writer.write(recorded.body)
        return True

    async def _forward(
        self,
        grant: Grant,
        head: Head,
        body: bytes,
        api: Api | None,
        used: str | None,
        key: str,
        writer: asyncio.StreamWriter,
    ) -> bool:
        sent = (api and include_usage_in_stream(api, body)) or body
        headers = [
            (name, value)
            for name, value in head.passed_on()
            if name not in AUTH_HEADERS and name != "accept-encoding"
        ]
        headers += [("host", self.upstream.authority), ("accept-encoding", "identity")]
        headers += self.upstream.auth(used)
        request = Head(
            method=head.method, target=self.upstream.target(head.target), headers=headers
        )
        try:
            connection, answer = await self._exchange(request, sent)
        except (OSError, WireError, TimeoutError, asyncio.IncompleteReadError) as error:
            what = f"the endpoint did not answer: {error or type(error).__name__}"
            grant.saw("api_error", what)
            return _send(writer, *_error(502, "api_error", self.redactor.text(what)))
        return await self._pass_answer(grant, head, api, key, connection, answer, writer)

    async def _exchange(self, request: Head, body: bytes) -> tuple[Connection, Head]:
        """Send the request; the answer's head. A kept connection the endpoint closed
        meanwhile is tried once more on a new one."""
        for attempt in range(2):
            connection = await self.upstream.connect()
            try:
                write_head(connection.writer, request, length=len(body))
                connection.writer.write(body)
                await connection.writer.drain()
                answer = await read_head(connection.reader, answer=True)
                if answer is None:
                    raise ConnectionResetError("the endpoint closed the connection")
                return connection, answer
            except (OSError, WireError, asyncio.IncompleteReadError):
                connection.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _pass_answer(
        self,
        grant: Grant,
        head: Head,
        api: Api | None,
        key: str,
        connection: Connection,
        answer: Head,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """The answer passed on to the harness as it comes, counted (and recorded) once
        whole; False when the harness's connection cannot carry another request."""
        content_type = answer.get("content-type") or ""
        streamed = content_type.startswith("text/event-stream")
        has_body = (
            head.method != "HEAD" and answer.status not in (204, 304) and answer.status >= 200
        )
        copy = _AnswerCopy(
            writer,
            length=answer.length if has_body else 0,
            stream=StreamUsage(api) if api is not None and streamed else None,
        )
        out = Head(status=answer.status, reason=answer.reason, headers=answer.passed_on())
        write_head(writer, out, length=copy.length, chunked=copy.length is None)
        try:
            if has_body:
                await copy.run(body_chunks(connection.reader, answer, until_close=True))
        except (WireError, OSError, asyncio.IncompleteReadError):
            connection.close()
            copy.whole, copy.client_gone = False, True
        else:
            framed = answer.chunked or answer.length is not None or not has_body
            if framed and answer.keep_alive and not copy.client_gone:
                self.upstream.release(connection)
            else:
                connection.close()
        data = b"".join(copy.kept)
        self._settle(grant, api, answer.status, content_type, data, stream=copy.stream)
        if self.start.record is not None and copy.whole:
            recorded = Recorded(answer.status, content_type, self.redactor.bytes(data))
            self._cassette(grant).keep(key, head.method, head.target.split("?", 1)[0], recorded)
        return not copy.client_gone

    def _settle(
        self,
        grant: Grant,
        api: Api | None,
        status: int,
        content_type: str,
        body: bytes,
        *,
        stream: StreamUsage | None = None,
    ) -> None:
        """Count and price one answer of a model call, and note the cause it shows."""
        if api is None:
            return
        if stream is None and content_type.startswith("text/event-stream"):
            stream = StreamUsage(api)
            stream.feed(body)
        cause = verdict(status, body[:65536])
        if cause is None and stream is not None:
            cause = stream.error_cause
        if cause is not None:
            grant.saw(cause, f"HTTP {status}" if status >= 400 else "an error event in the stream")
        usage = stream.result() if stream is not None else usage_of_body(api, body)
        self.ledger.charge(grant, self._counts(usage, grant))

    def _counts(self, usage: CallUsage | None, grant: Grant) -> Counts:
        if usage is None:
            return Counts(requests=1)
        model = usage.model or grant.request.models[0]
        price = self.prices.price_of(model) or self.prices.price_of(grant.request.models[0])
        return Counts(
            requests=1,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            cost_usd=0.0 if price is None else price.cost(usage),
            unpriced=0 if price is not None else 1,
        )

    def _cassette(self, grant: Grant) -> Cassette:
        name = grant.request.cassette
        cassette = self._cassettes.get(name)
        if cassette is None:
            if self.start.replay is not None:
                cassette = Cassette.read(cassette_path(Path(self.start.replay), name))
            else:
                assert self.start.record is not None
                cassette = Cassette(cassette_path(Path(self.start.record), name))
            self._cassettes[name] = cassette
        return cassette

    # ------------------------------------------------------------------ the run's asks

    async def _serve_control(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                head = await read_head(reader, answer=False)
                if head is None:
                    return
                body = await read_body(reader, head)
                status, answer = await self._control(head.method, head.target, body)
                data = json.dumps(answer).encode()
                write_head(writer, Head(status=status, headers=_JSON), length=len(data))
                writer.write(data)
                await writer.drain()
        except (WireError, ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _control(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        ledger = self.ledger
        try:
            if (method, target) == ("POST", "/grants"):
                grant = ledger.grant(GrantRequest.model_validate_json(body))
                return 200, {"token": grant.token}
            if target.startswith("/grants/") and method in ("GET", "DELETE"):
                token = target.removeprefix("/grants/")
                found = ledger.find(token) if method == "GET" else ledger.end(token)
                if found is None:
                    return 404, {"error": "no such grant"}
                return 200, found.report().model_dump(mode="json")
            if (method, target) == ("GET", "/spend"):
                return 200, ledger.state().model_dump(mode="json")
            if (method, target) == ("POST", "/listen"):
                address = str(json.loads(body)["address"])
                return 200, {"port": await self.listen(address)}
        except (ValidationError, ValueError, KeyError, TypeError, OSError) as error:
            return 400, {"error": str(error)}
        return 404, {"error": f"no {method} {target}"}


class _AnswerCopy:
    """An answer's body on its way to the harness: re-framed (by its length, or chunked),
    fed to the usage reader, and kept up to a cap for counting and recording. A harness
    that went away stops the copy to it, not the reading (the answer is still counted)."""

    def __init__(
        self, writer: asyncio.StreamWriter, *, length: int | None, stream: StreamUsage | None
    ) -> None:
        self.writer = writer
        self.length = length
        self.stream = stream
        self.kept: list[bytes] = []
        self.size = 0
        self.whole = True
        self.client_gone = False

    async def run(self, chunks: AsyncIterator[bytes]) -> None:
        async for chunk in chunks:
            if self.stream is not None:
                self.stream.feed(chunk)
            self.size += len(chunk)
            if self.size <= _ANSWER_CAP:
                self.kept.append(chunk)
            else:
                self.whole = False
            await self._send(chunk)
        if self.length is None:
            await self._send(b"")

    async def _send(self, chunk: bytes) -> None:
        if self.client_gone:
            return
        try:
            if self.length is None:
                write_chunk(self.writer, chunk)
            elif chunk:
                self.writer.write(chunk)
            await self.writer.drain()
        except ConnectionError:
            self.client_gone = True


def _token_of(head: Head) -> tuple[str | None, str | None]:
    """The header the harness put its token in, and the token."""
    for name in AUTH_HEADERS:
        value = head.get(name)
        if value is None:
            continue
        if name == "authorization":
            scheme, _, value = value.partition(" ")
            if scheme.lower() != "bearer":
                continue
        return name, value.strip()
    return None, None


def _send(writer: asyncio.StreamWriter, status: int, body: bytes) -> bool:
    write_head(writer, Head(status=status, headers=_JSON), length=len(body))
    writer.write(body)
    return True


# ---------------------------------------------------------------------- the process


def _die_with_parent() -> None:
    """Linux: end this process when the one that started it ends (its input closing says
    so too; this covers a parent killed while the pipe is held by another)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


async def _run(start: RelayStart, prices: PriceTable, say: Callable[[str], None]) -> None:
    relay = Relay(start, prices)
    port = await relay.listen("127.0.0.1")
    control = await relay.serve_control(start.control_socket)
    os.chmod(start.control_socket, 0o600)
    say(json.dumps({"port": port}))
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, ended.set)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    waiting = asyncio.ensure_future(reader.read())
    stopping = asyncio.ensure_future(ended.wait())
    await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
    control.close()
    relay.close()


def main() -> None:
    """`python -m pytest_harbor.relay.server`: one line of `RelayStart` JSON on the input,
    then `{"port": N}` on the output once it serves; it ends when its input closes."""
    _die_with_parent()
    line = sys.stdin.buffer.readline()
    try:
        start = RelayStart.model_validate_json(line)
        prices = default_prices() if start.prices is None else load_prices(Path(start.prices))
    except (ValidationError, ValueError) as error:
        print(json.dumps({"error": str(error)}), flush=True)
        sys.exit(2)

    def say(text: str) -> None:
        print(text, flush=True)

    asyncio.run(_run(start, prices, say))


if __name__ == "__main__":
    main()
