"""A WebSocket on the connection of an http.server request, served as execd's
gorilla/websocket serves one: the upgrade, frames both ways (websockets' sans-I/O
protocol: masking, fragments, answers to pings and to a close), the read deadline, and
the two ways it ends.

A close the server starts (a frame, or none) ends the connection at once. After a close
the client starts, a protocol error or a passed deadline, execd stops reading and
returns, but never closes the connection (its handler has no `conn.Close()`): Go's
garbage collector does, some time later. Until then a client's close handshake waits
for the end of the connection, up to the client's own close timeout."""

from __future__ import annotations

import contextlib
import io
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

from websockets.datastructures import Headers
from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

if TYPE_CHECKING:
    from tests.opensandbox_fake.wire import _Handler

#: A client that sends nothing (no message, no answer to a ping) this long is no longer
#: read (execd's wsReadDeadline).
READ_DEADLINE_S = 60.0
#: The longest a write may take (wsWriteDeadline); past it the write failed.
WRITE_DEADLINE_S = 10.0
#: How long a connection execd stopped serving stays open at most: until Go's garbage
#: collector closes it, at the latest at its forced collection, every 2 minutes.
LINGER_S = 120.0
#: How long the fake waits, after a close it started, for the client to close its side
#: (execd closes at once; the fake reads what is still coming, so that its close is a
#: clean one and never a reset that could lose the last frames on the client's side).
CLOSING_S = 2.0
#: How often a blocked read looks whether it should stop.
POLL_S = 0.2
#: What gorilla/websocket answers to a request it cannot upgrade (http.Error).
REFUSED = b"Bad Request\n"


class ServerWebSocket:
    """The server's side of one WebSocket; its methods may be called from any thread,
    `messages` and `settle` from the one that serves the request."""

    def __init__(self, connection: socket.socket, protocol: ServerProtocol, early: bytes) -> None:
        self._socket = connection
        self._protocol = protocol
        self._early = early
        self._lock = threading.Lock()
        self._partial: tuple[Opcode, bytearray] | None = None
        self._deadline = time.monotonic() + READ_DEADLINE_S
        self._finished = False
        self._cut = threading.Event()

    @classmethod
    def accept(cls, handler: _Handler) -> ServerWebSocket | None:
        """The upgraded connection of `handler`'s request; None when the request is no
        WebSocket handshake (then answered 400, as gorilla/websocket does)."""
        handler.close_connection = True
        # The request was read by http.server: one protocol checks it and answers the
        # handshake, another, open from the start, speaks the frames that follow.
        handshake = ServerProtocol()
        response = handshake.accept(Request(handler.path, Headers(handler.headers.items())))
        if response.status_code != 101:
            extra = {"Sec-Websocket-Version": "13", "X-Content-Type-Options": "nosniff"}
            handler.reply(400, REFUSED, "text/plain; charset=utf-8", extra)
            return None
        connection = handler.connection
        try:
            connection.sendall(response.serialize())
        except OSError:
            return None
        handler.answered = True
        # What the client sent after its handshake may wait in the request's buffered
        # reader: taken without blocking (a non-blocking peek answers what it holds).
        reader = cast(io.BufferedReader, handler.rfile)
        connection.setblocking(False)
        try:
            early = reader.peek()
            if early:
                reader.read1(len(early))
        finally:
            connection.settimeout(WRITE_DEADLINE_S)
        return cls(connection, ServerProtocol(state=State.OPEN, max_size=None), bytes(early))

    # -- sending ------------------------------------------------------------------------------

    def send_text(self, data: bytes) -> bool:
        """False when it could not be sent (the connection is closing, or broken)."""
        return self._send(lambda: self._protocol.send_text(data))

    def send_binary(self, data: bytes) -> bool:
        return self._send(lambda: self._protocol.send_binary(data))

    def ping(self) -> bool:
        return self._send(lambda: self._protocol.send_ping(b""))

    def finish(self, code: int | None = None, reason: str = "") -> None:
        """The server's end of the connection: a close frame when `code` is given, then
        no more (the rest waits for settle())."""
        with self._lock:
            self._finished = True
            if code is not None:
                with contextlib.suppress(InvalidState, OSError):
                    self._protocol.send_close(code, reason)
                    self._flush()
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Ends the connection now, from any thread, as a dying server's does."""
        self._cut.set()
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)

    def _send(self, make: Callable[[], None]) -> bool:
        with self._lock:
            try:
                make()
                self._flush()
            except (InvalidState, OSError):
                return False
        return True

    def _flush(self) -> None:
        """Sends what the protocol has to send (the lock held). Its end of stream (b"")
        is left out: when to end the connection is decided in finish() and settle()."""
        for data in self._protocol.data_to_send():
            if data:
                self._socket.sendall(data)

    # -- receiving ----------------------------------------------------------------------------

    def messages(self, stop: threading.Event) -> Iterator[tuple[Opcode, bytes]]:
        """The client's messages (TEXT or BINARY, whole), until it closes, breaks the
        protocol or goes silent past the deadline, or until `stop` is set."""
        data = self._early or self._read(stop)
        while data is not None:
            with self._lock:
                if data:
                    self._protocol.receive_data(data)
                else:
                    self._protocol.receive_eof()
                events = self._protocol.events_received()
                with contextlib.suppress(OSError):
                    self._flush()  # the answers to pings and to a close
            for event in events:
                message = self._message(event) if isinstance(event, Frame) else None
                if message is not None:
                    yield message
            if not data or self._protocol.state is not State.OPEN:
                return
            data = self._read(stop)

    def _read(self, stop: threading.Event) -> bytes | None:
        """What came next (b"" at the end); None when stopped, cut, broken or silent past
        the deadline."""
        while not stop.is_set() and not self._cut.is_set():
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                ready, _, _ = select.select([self._socket], [], [], min(remaining, POLL_S))
                if ready:
                    return self._socket.recv(65536)
            except (OSError, ValueError):
                return None
        return None

    def _message(self, frame: Frame) -> tuple[Opcode, bytes] | None:
        """A whole message once its last fragment came; the deadline moves on with each
        message and with each pong (gorilla's pong handler), not with a client's ping."""
        if frame.opcode is Opcode.PONG:
            self._deadline = time.monotonic() + READ_DEADLINE_S
            return None
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
            self._partial = (frame.opcode, bytearray(frame.data))
        elif frame.opcode is Opcode.CONT and self._partial is not None:
            self._partial[1].extend(frame.data)
        else:
            return None
        if not frame.fin:
            return None
        opcode, data = self._partial
        self._partial = None
        self._deadline = time.monotonic() + READ_DEADLINE_S
        return opcode, bytes(data)

    # -- the end ------------------------------------------------------------------------------

    def settle(self) -> None:
        """Waits until the client has closed the connection (read and dropped meanwhile),
        CLOSING_S at most after the server's own end, LINGER_S otherwise (see the
        module), then ends it."""
        wait = CLOSING_S if self._finished else LINGER_S
        deadline = time.monotonic() + wait
        while not self._cut.is_set() and (remaining := deadline - time.monotonic()) > 0:
            try:
                ready, _, _ = select.select([self._socket], [], [], min(remaining, POLL_S))
                if ready and not self._socket.recv(65536):
                    break
            except (OSError, ValueError):
                break
        self.cut()
