"""An exec on the engine: started with its output (and input) on a hijacked connection,
output frames read by a thread of its own, input sent, the command's pid learned from its
first stderr line so that a deadline can kill its process group, and its exit code."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import docker
from docker.utils.socket import STDERR as _STDERR
from docker.utils.socket import STDOUT as _STDOUT
from docker.utils.socket import frames_iter

from pytest_harbor.display import harbor_logger
from pytest_harbor.sandboxes import output
from pytest_harbor.sandboxes.output import CappedOutput

log = harbor_logger()


class ExecConnection:
    """The hijacked exec connection: frames out, stdin in, closable from any thread."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        # SocketIO wraps the socket for unix connections; TLS connections are plain.
        self._raw: socket.socket = getattr(sock, "_sock", sock)
        self._raw.settimeout(None)
        #: Not a plain socket (TLS, or an ssh client's pipes): read without polling the
        #: file descriptor (TLS may hold decrypted bytes the descriptor does not show;
        #: the ssh connection's descriptor is not where its bytes come from), and never
        #: half-closed (neither can close one direction and go on reading the other).
        self.tunnelled = isinstance(self._raw, ssl.SSLSocket) or type(
            self._raw
        ).__module__.endswith(".sshconn")

    def frames(self) -> Iterator[tuple[int, bytes]]:
        if not self.tunnelled:
            yield from frames_iter(self.sock, tty=False)
            return
        while True:
            header = _receive(self._raw, _FRAME_HEADER.size)
            if header is None:
                return
            stream, size = _FRAME_HEADER.unpack(header)
            data = _receive(self._raw, size) if size else b""
            if data is None:
                raise ValueError("the output stream ended inside a frame")
            if data:
                yield stream, data

    def send(self, data: bytes) -> None:
        """Write `data` and keep the input open (a channel's next request follows);
        raises OSError when the connection broke."""
        self._raw.sendall(data)

    def send_all(self, data: bytes) -> None:
        try:
            self._raw.sendall(data)
            if not self.tunnelled:
                self._raw.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the command ended without reading all of its input

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._raw.close()


@dataclass(frozen=True)
class EngineExec:
    """An exec the engine started: its id and its hijacked connection."""

    api: docker.APIClient
    id: str
    connection: ExecConnection

    def exit_code(self) -> int | None:
        """Its command's exit code; None while it runs, or when the engine cannot say.
        Raises what the engine raises (engine.ENGINE_ERRORS)."""
        info = self.api.exec_inspect(self.id)
        code = info.get("ExitCode")
        return None if code is None or info.get("Running") else int(code)


def start_exec(
    api: docker.APIClient,
    container: str,
    argv: Sequence[str],
    *,
    user: str,
    stdin: bool = False,
    workdir: str | None = None,
    env: Mapping[str, str] | None = None,
) -> EngineExec:
    """Create and start an exec of `argv` in `container`, its stdout and stderr (and its
    stdin, with `stdin`) on a connection of its own. Raises what the engine raises
    (engine.ENGINE_ERRORS)."""
    exec_id = api.exec_create(
        container,
        list(argv),
        stdout=True,
        stderr=True,
        stdin=stdin,
        user=user,
        workdir=workdir,
        environment=[f"{key}={value}" for key, value in (env or {}).items()],
    )["Id"]
    return EngineExec(api, exec_id, ExecConnection(api.exec_start(exec_id, socket=True)))


#: The header of each frame of an exec's output: stream, three zero bytes, length.
_FRAME_HEADER = struct.Struct(">BxxxL")


def _receive(sock: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes, or None when the stream ended before the first of them."""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            if chunks:
                raise ValueError("the output stream ended inside a frame")
            return None
        chunks += chunk
    return bytes(chunks)


class OutputReader:
    """Drains an exec connection; learns the command's pid from the first stderr line."""

    def __init__(self, connection: ExecConnection, reads_pid: bool) -> None:
        self._connection = connection
        self.out = CappedOutput()
        self._err = CappedOutput()
        self._pid: int | None = None
        self._pid_known = threading.Event()
        self._reads_pid = reads_pid
        #: Why the output stream broke off, when it did for a reason other than a close.
        self.broken: str | None = None
        #: Bytes of output read, and whether reading stopped at EXEC_READ_CAP.
        self.read = 0
        self.capped = False
        if not reads_pid:
            self._pid_known.set()

    def run(self) -> None:
        try:
            for stream, data in self._connection.frames():
                self.read += len(data)
                if self.read > output.EXEC_READ_CAP:
                    self.capped = True
                    # Closed at once: the engine, held by a connection nobody reads,
                    # would hold the next exec of the sandbox too (the kill among them).
                    self._connection.close()
                    self.out.append(
                        f"\n[... output not read past {output.EXEC_READ_CAP} bytes: "
                        "the command was ended ...]\n".encode()
                    )
                    return
                if stream == _STDOUT:
                    self.out.append(data)
                elif stream == _STDERR:
                    self._err.append(data)
                    if not self._pid_known.is_set():
                        self._take_pid()
        except (OSError, ValueError):
            pass  # closed under us after a deadline; what was read is kept
        except Exception as error:  # a torn frame: the output cannot be trusted whole
            self.broken = f"{type(error).__name__}: {error}"
        finally:
            self._pid_known.set()

    def _take_pid(self) -> None:
        line, newline, _ = bytes(self._err.head).partition(b"\n")
        if not newline:
            return
        self._pid = int(line) if line.strip().isdigit() else None
        self._err.drop_prefix(len(line) + 1)
        self._pid_known.set()

    def wait_for_pid(self, timeout: float) -> int | None:
        self._pid_known.wait(timeout)
        return self._pid

    def stderr(self) -> bytes:
        if self._reads_pid and self._pid is None:
            self._take_pid()
        return self._err.value()
