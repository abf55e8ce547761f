"""A command in a sandbox with its input and output joined to this process: the relay an
agent's tool connections (MCP) run through, so that they reach exactly what the agent in
the sandbox reaches. Each pipe is one exec on its own hijacked connection; the command's
pid comes first on its stderr, and closing the pipe ends the command's process group."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from docker.utils.socket import STDERR as _STDERR
from docker.utils.socket import STDOUT as _STDOUT

from pytest_harbor.sandboxes.base import SandboxError
from pytest_harbor.sandboxes.docker.stream import ExecConnection
from pytest_harbor.sandboxes.pipes import QueuedPipe

__all__ = ["PID_FIRST", "DockerPipe"]

#: Says the shell's pid on stderr, then becomes the command.
PID_FIRST = 'echo "$$" >&2; exec "$@"'


class DockerPipe(QueuedPipe):
    """A running command's stdin (`send`) and stdout (`receive`); see the module."""

    def __init__(self, connection: ExecConnection, kill: Callable[[int], None], what: str) -> None:
        self._connection = connection
        self._kill = kill
        super().__init__(what)
        self._pid: int | None = None
        self._reader = threading.Thread(target=self._read, name="harbor-pipe", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for stream, data in self._connection.frames():
                if stream == _STDOUT:
                    self._put(data)
                elif stream == _STDERR:
                    self._err.append(data)
                    if self._pid is None:
                        self._take_pid()
        except (OSError, ValueError):
            pass  # closed under us, or a torn frame: the output ends here
        finally:
            self._end()

    def _take_pid(self) -> None:
        line, newline, _ = bytes(self._err.head).partition(b"\n")
        if newline:
            self._pid = int(line) if line.strip().isdigit() else -1
            self._err.drop_prefix(len(line) + 1)

    def send(self, data: bytes) -> None:
        if self._closed.is_set():
            raise SandboxError(f"{self._what}: the pipe is closed")
        try:
            self._connection.send(data)
        except OSError as error:
            raise SandboxError(f"{self._what}: the pipe broke ({error})") from None

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._pid is not None and self._pid > 0:
            with contextlib.suppress(SandboxError):
                self._kill(self._pid)
        self._connection.close()
