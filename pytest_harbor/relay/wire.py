"""HTTP/1.1 as the relay reads and writes it, over asyncio streams.

Both sides of the relay are strangers: a request comes from a harness (an agent in a
sandbox, most of the time), an answer from an endpoint. Every reader here is bounded (a
head, a body, one chunk) and total: bytes that are not HTTP end that connection with
`WireError`, never the relay.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = [
    "BODY_CAP",
    "HEAD_CAP",
    "Head",
    "WireError",
    "body_chunks",
    "read_body",
    "read_head",
    "write_chunk",
    "write_head",
]

#: The most a request's or an answer's line and headers may hold.
HEAD_CAP = 64 * 1024
#: The most a request body (a whole conversation, with images) may hold.
BODY_CAP = 64 * 1024 * 1024
#: Headers of one hop only (RFC 9110, 7.6.1), never passed on.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
        "expect",
    }
)
#: A header's name (RFC 9110's token) and what its value may hold: visible characters,
#: spaces and tabs, never a line end or another control character.
_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_METHOD = re.compile(r"[A-Z]{1,16}")
_TARGET = re.compile(r"[\x21-\x7e]+")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    402: "Payment Required",
    403: "Forbidden",
    404: "Not Found",
    413: "Content Too Large",
    424: "Failed Dependency",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    504: "Gateway Timeout",
}


class WireError(Exception):
    """What came is not HTTP/1.1 the relay reads, or is over a cap: the connection ends."""


@dataclass
class Head:
    """A request's line (`method`, `target`) or an answer's (`status`), and its headers
    in the order they came, names lower-cased."""

    method: str = ""
    target: str = ""
    #: `HTTP/1.1`, or `HTTP/1.0` (whose connection closes unless it asks otherwise).
    version: str = "HTTP/1.1"
    status: int = 0
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def chunked(self) -> bool:
        coding = self.get("transfer-encoding")
        return coding is not None and coding.lower().strip().endswith("chunked")

    @property
    def length(self) -> int | None:
        """The Content-Length, or None; WireError when it is not one number."""
        value = self.get("content-length")
        if value is None:
            return None
        value = value.strip()
        if not value.isdigit() or len(value) > 15:
            raise WireError(f"bad Content-Length {value[:20]!r}")
        return int(value)

    @property
    def keep_alive(self) -> bool:
        connection = (self.get("connection") or "").lower().strip()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"

    @property
    def expects_continue(self) -> bool:
        return (self.get("expect") or "").lower().strip() == "100-continue"

    def passed_on(self) -> list[tuple[str, str]]:
        """The end-to-end headers: those of one hop left out."""
        return [(key, value) for key, value in self.headers if key not in HOP_HEADERS]


async def read_head(reader: asyncio.StreamReader, *, answer: bool) -> Head | None:
    """The next head on `reader`; None when the peer closed before a first byte."""
    try:
        data = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if not error.partial.strip():
            return None
        raise WireError("the connection closed inside a head") from None
    except asyncio.LimitOverrunError:
        raise WireError(f"a head over {HEAD_CAP} bytes") from None
    if len(data) > HEAD_CAP:
        raise WireError(f"a head over {HEAD_CAP} bytes")
    lines = data.decode("latin-1").split("\r\n")
    head = _first_line(lines[0], answer=answer)
    for line in lines[1:-2]:
        name, colon, value = line.partition(":")
        # Strictly: a bare line end, a control character or a folded line in a header
        # would let the next hop read a header, or a request, that the relay did not.
        if not colon or not _NAME.fullmatch(name) or not _VALUE.fullmatch(value):
            raise WireError(f"a bad header line {line[:40]!r}")
        head.headers.append((name.lower(), value.strip(" \t")))
    return head


def _first_line(line: str, *, answer: bool) -> Head:
    parts = line.split(" ", 2)
    if answer:
        if (
            len(parts) < 2
            or parts[0] not in ("HTTP/1.1", "HTTP/1.0")
            or not (parts[1].isdigit() and len(parts[1]) == 3)
        ):
            raise WireError(f"not an HTTP/1.1 status line: {line[:60]!r}")
        reason = parts[2] if len(parts) > 2 else ""
        return Head(version=parts[0], status=int(parts[1]), reason=reason)
    if (
        len(parts) != 3
        or parts[2] not in ("HTTP/1.1", "HTTP/1.0")
        or not _METHOD.fullmatch(parts[0])
        or not _TARGET.fullmatch(parts[1])
    ):
        raise WireError(f"not an HTTP/1.1 request line: {line[:60]!r}")
    target = parts[1]
    if target.startswith(("http://", "https://")):
        # The absolute form a client sends through a proxy (a sandbox's egress): the
        # path is what the relay serves.
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    if not target.startswith("/"):
        raise WireError(f"not an HTTP/1.1 request line: {line[:60]!r}")
    return Head(method=parts[0], target=target, version=parts[2])


async def body_chunks(
    reader: asyncio.StreamReader, head: Head, *, until_close: bool
) -> AsyncIterator[bytes]:
    """The body of `head` as it arrives: by its chunks, its length, or (an answer with
    neither, `until_close`) to the end of the connection."""
    if head.chunked:
        async for chunk in _chunks(reader):
            yield chunk
        return
    length = head.length
    if length is None:
        if until_close:
            while chunk := await reader.read(65536):
                yield chunk
        return
    while length > 0:
        chunk = await reader.read(min(length, 65536))
        if not chunk:
            raise WireError("the connection closed inside a body")
        length -= len(chunk)
        yield chunk


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            raise WireError("a bad chunk size line") from None
        size_text = line.split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise WireError(f"a bad chunk size {size_text[:20]!r}")
        size = int(size_text, 16)
        if size > BODY_CAP:
            raise WireError(f"a chunk of {size} bytes")
        if size == 0:
            # Trailers, if any, up to the empty line.
            while True:
                try:
                    trailer = await reader.readuntil(b"\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    raise WireError("a bad trailer") from None
                if trailer == b"\r\n":
                    return
        try:
            data = await reader.readexactly(size + 2)
        except asyncio.IncompleteReadError:
            raise WireError("the connection closed inside a chunk") from None
        if data[-2:] != b"\r\n":
            raise WireError("a chunk not ended by CRLF")
        yield data[:-2]


async def read_body(reader: asyncio.StreamReader, head: Head, *, cap: int = BODY_CAP) -> bytes:
    """A request's whole body (a request without length or chunks has none)."""
    body = bytearray()  # one buffer, however small the pieces it comes in
    async for chunk in body_chunks(reader, head, until_close=False):
        if len(body) + len(chunk) > cap:
            raise WireError(f"a body over {cap} bytes")
        body += chunk
    return bytes(body)


def write_head(
    writer: asyncio.StreamWriter,
    head: Head,
    *,
    length: int | None = None,
    chunked: bool = False,
    close: bool = False,
) -> None:
    """A request's or an answer's head, framed by `length` or `chunked` (else neither:
    a request without a body)."""
    if head.method:
        first = f"{head.method} {head.target} HTTP/1.1\r\n"
    else:
        reason = head.reason or _REASONS.get(head.status, "")
        first = f"HTTP/1.1 {head.status} {reason}\r\n"
    lines = [first]
    lines += [f"{key}: {value}\r\n" for key, value in head.headers]
    if length is not None:
        lines.append(f"content-length: {length}\r\n")
    elif chunked:
        lines.append("transfer-encoding: chunked\r\n")
    if close:
        lines.append("connection: close\r\n")
    lines.append("\r\n")
    writer.write("".join(lines).encode("latin-1", errors="replace"))


def write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    """One chunk of a chunked body; an empty one ends it."""
    if data:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    else:
        writer.write(b"0\r\n\r\n")
