"""The model endpoint as the relay reaches it: where a relayed path goes, the key in the
header the harness used, and a pool of connections kept open between calls."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pytest_harbor.relay.wire import HEAD_CAP

__all__ = ["AUTH_HEADERS", "RELAY_BASE", "Connection", "Upstream"]

#: The base path every harness is given (its model URL is the relay's address and this).
RELAY_BASE = "/v1"
#: The headers a harness may carry its token in; the key goes upstream in the same one.
AUTH_HEADERS = ("authorization", "x-api-key", "api-key")
#: Idle connections kept per endpoint.
_POOL = 32
_CONNECT_S = 30.0


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: Kept from an earlier call (the endpoint may have closed it meanwhile).
    reused: bool = False

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


@dataclass
class Upstream:
    """The endpoint at `base` (as --harbor-model-url: `http(s)://host[:port]/path`)."""

    base: str
    key: str | None
    _idle: list[Connection] = field(default_factory=list)

    def __post_init__(self) -> None:
        parts = urlsplit(self.base)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if self.tls else 80)
        default = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        self.authority = self.host if default else f"{self.host}:{self.port}"
        self.path = parts.path.rstrip("/")
        self._context = ssl.create_default_context() if self.tls else None
        if self._context is not None:
            self._context.set_alpn_protocols(["http/1.1"])

    def target(self, relayed: str) -> str:
        """Where a path the harness asked of the relay goes: below the relay's base, below
        the endpoint's; anything else below the endpoint's root (its base without `/v1`),
        as a harness given the root adds `/v1/...` itself."""
        if relayed == RELAY_BASE or relayed.startswith((RELAY_BASE + "/", RELAY_BASE + "?")):
            return self.path + relayed[len(RELAY_BASE) :]
        root = self.path.removesuffix("/v1")
        return root + relayed

    def auth(self, used: str | None) -> list[tuple[str, str]]:
        """The key in the header the harness put its token in (none without a key)."""
        if self.key is None:
            return []
        if used == "x-api-key" or used == "api-key":
            return [(used, self.key)]
        return [("authorization", f"Bearer {self.key}")]

    async def connect(self) -> Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable():
                connection.reused = True
                return connection
            connection.close()
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                self.host,
                self.port,
                ssl=self._context,
                server_hostname=self.host if self.tls else None,
                limit=HEAD_CAP,
            ),
            _CONNECT_S,
        )
        return Connection(reader, writer)

    def release(self, connection: Connection) -> None:
        if connection.usable() and len(self._idle) < _POOL:
            self._idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
