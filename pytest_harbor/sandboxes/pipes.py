"""Commands in a sandbox with their input and output joined to this process: the relay an
agent's tool connections (MCP) take, so that they reach what the agent reaches."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from pytest_harbor.sandboxes.output import CappedOutput

__all__ = ["OpensPipes", "Pipe", "QueuedPipe"]

#: The most output chunks waiting to be received before a pipe's reader stops reading
#: (the sandbox then holds the command's output: back-pressure, not loss).
QUEUED_CHUNKS = 256


class Pipe(Protocol):
    """A command running in a sandbox with its stdin and stdout joined to this process
    (OpensPipes): what an agent's tool connections run through."""

    def send(self, data: bytes) -> None:
        """Write to the command's stdin; SandboxError when the pipe is closed or broke."""
        ...

    def receive(self, timeout: float | None = None) -> bytes:
        """The command's next output; b"" once it ended or the pipe closed; TimeoutError
        when nothing came within `timeout` seconds."""
        ...

    def stderr_tail(self) -> str:
        """The last of what the command wrote to stderr."""
        ...

    def close(self) -> None:
        """End the command and the pipe; safe twice and from any thread."""
        ...


@runtime_checkable
class OpensPipes(Protocol):
    """A sandbox that can run a command with its input and output joined to this process
    (the docker provider's can)."""

    def open_pipe(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Pipe: ...


class QueuedPipe:
    """The half of a pipe its reader thread fills, for `receive()` and `stderr_tail()`:
    the command's stdout in chunks (at most QUEUED_CHUNKS waiting), the last of its
    stderr (`_err`). A provider's pipe is one of these with a reader and `send`/`close`;
    `_closed` set stops the reader waiting on a full queue."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._closed = threading.Event()
        self._chunks: queue.Queue[bytes] = queue.Queue(maxsize=QUEUED_CHUNKS)
        self._ended = False
        self._err = CappedOutput(8192)

    def _put(self, data: bytes) -> None:
        """Queue a chunk of stdout, waiting while the queue is full, until the pipe closes."""
        while data and not self._closed.is_set():
            try:
                self._chunks.put(data, timeout=0.5)
                return
            except queue.Full:
                continue

    def _end(self) -> None:
        """The output ended: `receive()` gives b"" once the queued chunks are taken."""
        with contextlib.suppress(queue.Full):
            self._chunks.put_nowait(b"")

    def receive(self, timeout: float | None = None) -> bytes:
        """The next output of the command; b"" once it ended or the pipe was closed.
        TimeoutError when nothing came within `timeout` seconds."""
        if self._ended:
            return b""
        try:
            chunk = self._chunks.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self._what}: no output within {timeout:g} s") from None
        if not chunk:
            self._ended = True
        return chunk

    def stderr_tail(self) -> str:
        return self._err.value().decode("utf-8", errors="replace")[-2000:]
