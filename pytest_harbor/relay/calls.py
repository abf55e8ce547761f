"""One admitted request, from the relay to the endpoint and back (or from a cassette):
its answer passed on as it comes, counted, priced and recorded once whole; a call cut
short (the harness gone, its grant closed) counted as far as it went."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import AsyncIterator
from pathlib import Path

from pytest_harbor.redaction import Redactor
from pytest_harbor.relay.admission import Call
from pytest_harbor.relay.cassettes import Cassette, Recorded, cassette_path
from pytest_harbor.relay.ledger import Grant, Ledger
from pytest_harbor.relay.prices import PriceTable
from pytest_harbor.relay.reports import Counts, RelayStart
from pytest_harbor.relay.upstream import Connection, Upstream
from pytest_harbor.relay.usage import (
    Api,
    CallUsage,
    StreamUsage,
    error_words,
    usage_of_body,
    verdict,
)
from pytest_harbor.relay.wire import (
    BODY_CAP,
    Head,
    WireError,
    body_chunks,
    read_head,
    write_chunk,
    write_head,
)

__all__ = ["REPLAY_MISS", "Exchanges", "refusal_body"]

REPLAY_MISS = "replay_miss"
#: The request headers passed on to the endpoint: what the APIs read of a call. Others
#: (an organization or project to bill, cookies, an SDK's own) stay with the relay.
PASSED_ON = frozenset(
    {"content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta"}
)
#: How long the harness may take to read each piece of its answer before it is left.
SEND_S = 30.0
#: A failure to reach the endpoint that is this machine's own (out of files, of memory),
#: not the endpoint's: answered without being taken for the endpoint's error.
_LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Bytes to a token, when an answer gave no counts and they are reckoned from its size.
_BYTES_PER_TOKEN = 4
#: The most of an endpoint's error text a grant keeps.
_WORDS = 300
_EXCHANGE_ERRORS = (OSError, WireError, TimeoutError, asyncio.IncompleteReadError)


def refusal_body(kind: str, message: str) -> bytes:
    """A refusal of the relay's own, in the shape both APIs' clients read."""
    error = {"type": kind, "message": f"pytest-harbor relay: {message}"}
    return json.dumps({"type": "error", "error": error}).encode()


class Exchanges:
    """The calls of one run: to the endpoint (or from the cassettes), each counted into
    the ledger."""

    def __init__(
        self, start: RelayStart, prices: PriceTable, ledger: Ledger, upstream: Upstream
    ) -> None:
        self.start = start
        self.prices = prices
        self.ledger = ledger
        self.upstream = upstream
        self.redactor = Redactor([start.api_key] if start.api_key else []).adding(start.masked)
        self._cassettes: dict[str, Cassette] = {}

    # ------------------------------------------------------------------ replay

    def replay(
        self, grant: Grant, head: Head, call: Call, key: str, writer: asyncio.StreamWriter
    ) -> None:
        recorded = self._cassette(grant).answer(key)
        if recorded is None:
            what = f"{head.method} {head.target.split('?', 1)[0]} (key {key})"
            grant.note(grant.replay_misses, what)
            body = refusal_body(REPLAY_MISS, f"no answer was recorded for {what}")
            write_head(writer, Head(status=424, headers=_JSON), length=len(body))
            writer.write(body)
            return
        self._settle(grant, call, recorded.status, recorded.content_type, recorded.body)
        headers = [("content-type", recorded.content_type)]
        write_head(writer, Head(status=recorded.status, headers=headers), length=len(recorded.body))
        writer.write(recorded.body)

    # ------------------------------------------------------------------ forward

    async def forward(
        self,
        grant: Grant,
        head: Head,
        call: Call,
        used: str | None,
        key: str,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """The call sent on with the key in the header the harness used; its answer passed
        back. False when the harness's connection cannot carry another request."""
        headers = [(name, value) for name, value in head.passed_on() if name in PASSED_ON]
        headers += [("host", self.upstream.authority), ("accept-encoding", "identity")]
        headers += self.upstream.auth(used)
        request = Head(
            method=head.method, target=self.upstream.target(head.target), headers=headers
        )
        body = call.body if head.method == "POST" else b""
        try:
            connection, answer = await self._exchange(request, body)
        except _EXCHANGE_ERRORS as error:
            if isinstance(error, OSError) and error.errno in _LOCAL_ERRNOS:
                # The relay's own shortage: not the endpoint's error, and no call was made.
                refusal = refusal_body("overloaded_error", f"the relay cannot call now: {error}")
                write_head(writer, Head(status=503, headers=_JSON), length=len(refusal))
                writer.write(refusal)
                return False
            what = f"the endpoint did not answer: {error or type(error).__name__}"
            grant.saw("api_error", what)
            grant.failed(None, self.redactor.text(what)[:_WORDS])
            self._cut_short(grant, call, b"")
            refusal = refusal_body("api_error", self.redactor.text(what))
            write_head(writer, Head(status=502, headers=_JSON), length=len(refusal))
            writer.write(refusal)
            return True
        except asyncio.CancelledError:
            self._cut_short(grant, call, b"")
            raise
        return await self._pass_answer(grant, head, call, key, connection, answer, writer)

    async def _exchange(self, request: Head, body: bytes) -> tuple[Connection, Head]:
        """Send the request; the answer's head (interim 1xx heads skipped). A kept
        connection the endpoint closed before answering anything is tried once more on a
        new one; nothing else is sent twice."""
        while True:
            connection = await self.upstream.connect()
            try:
                write_head(connection.writer, request, length=len(body))
                connection.writer.write(body)
                await connection.writer.drain()
                answer = await read_head(connection.reader, answer=True)
                while answer is not None and 100 <= answer.status < 200:
                    answer = await read_head(connection.reader, answer=True)
                if answer is None:
                    raise ConnectionResetError("the endpoint closed the connection")
                return connection, answer
            except (ConnectionError, asyncio.IncompleteReadError):
                connection.close()
                if not connection.reused:
                    raise
            except BaseException:
                connection.close()
                raise

    async def _pass_answer(
        self,
        grant: Grant,
        head: Head,
        call: Call,
        key: str,
        connection: Connection,
        answer: Head,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """The answer passed on to the harness as it comes, counted (and recorded) once
        whole; False when the harness's connection cannot carry another request."""
        content_type = answer.get("content-type") or ""
        streamed = content_type.startswith("text/event-stream")
        has_body = head.method != "HEAD" and answer.status not in (204, 304)
        try:
            length = answer.length if has_body else 0
        except WireError:
            connection.close()
            self._cut_short(grant, call, b"")
            raise
        copy = _AnswerCopy(
            writer,
            length=length,
            stream=StreamUsage(call.api) if call.api is not None and streamed else None,
        )
        out = Head(status=answer.status, reason=answer.reason, headers=answer.passed_on())
        write_head(writer, out, length=copy.length, chunked=copy.length is None)
        try:
            if has_body:
                await copy.run(body_chunks(connection.reader, answer, until_close=True))
        except (WireError, OSError, asyncio.IncompleteReadError):
            connection.close()
            copy.whole, copy.client_gone = False, True
        except asyncio.CancelledError:
            connection.close()
            self._settle(grant, call, answer.status, content_type, b"".join(copy.kept), copy.stream)
            raise
        else:
            framed = answer.chunked or answer.length is not None or not has_body
            if framed and answer.keep_alive and not copy.client_gone:
                self.upstream.release(connection)
            else:
                connection.close()
        data = b"".join(copy.kept)
        self._settle(grant, call, answer.status, content_type, data, copy.stream)
        if self.start.record is not None and copy.whole:
            recorded = Recorded(answer.status, content_type, self.redactor.bytes(data))
            self._cassette(grant).keep(key, head.method, head.target.split("?", 1)[0], recorded)
        return not copy.client_gone

    # ------------------------------------------------------------------ counting

    def _settle(
        self,
        grant: Grant,
        call: Call,
        status: int,
        content_type: str,
        body: bytes,
        stream: StreamUsage | None = None,
    ) -> None:
        """Count and price one answer of a model call, and note the cause it shows."""
        api = call.api
        if call.kind != "call" or api is None:
            return
        if stream is None and content_type.startswith("text/event-stream"):
            stream = StreamUsage(api)
            stream.feed(body)
        cause = verdict(status, body[:65536])
        if status >= 400:
            grant.failed(status, self.redactor.text(error_words(body[:65536]))[:_WORDS])
        if cause is None and stream is not None:
            cause = stream.error_cause
        if cause is not None:
            grant.saw(cause, f"HTTP {status}" if status >= 400 else "an error event in the stream")
        usage = stream.result() if stream is not None else usage_of_body(api, body)
        if usage is None and status < 400:
            self._cut_short(grant, call, body)
            return
        self.ledger.charge(grant, self._counts(usage, grant, api))

    def _cut_short(self, grant: Grant, call: Call, answer: bytes) -> None:
        """A model call whose answer gave no counts: its tokens reckoned from its bytes,
        so that the books (and the budget) hold it all the same."""
        if call.kind != "call" or call.api is None:
            return
        usage = CallUsage(
            prompt_tokens=len(call.body) // _BYTES_PER_TOKEN,
            completion_tokens=len(answer) // _BYTES_PER_TOKEN,
        )
        counts = self._counts(usage, grant, call.api)
        self.ledger.charge(grant, counts.model_copy(update={"estimated": 1}))

    def _counts(self, usage: CallUsage | None, grant: Grant, api: Api) -> Counts:
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


_JSON = [("content-type", "application/json")]


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
            if self.size <= BODY_CAP:
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
            await asyncio.wait_for(self.writer.drain(), SEND_S)
        except (ConnectionError, TimeoutError):
            # A harness that went away, or reads nothing, is left; the answer is still
            # read to its end and counted.
            self.client_gone = True
            self.writer.close()
