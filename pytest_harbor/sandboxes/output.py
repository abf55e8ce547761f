"""A command's output kept within a byte cap: its head and its tail, the cut noted."""

from __future__ import annotations

from collections import deque

__all__ = ["EXEC_OUTPUT_CAP", "EXEC_READ_CAP", "CappedOutput"]

#: The most of one output stream (stdout, or stderr) an exec keeps.
EXEC_OUTPUT_CAP = 8 * 1024 * 1024
#: The most of an exec's output (both streams) that is read: past it the command is
#: ended, so that one printing forever cannot keep this machine busy reading it.
EXEC_READ_CAP = 1024 * 1024 * 1024


class CappedOutput:
    """Bytes as they arrive, holding at most `cap`: the first half and the last half, with
    a note of how much was cut between them."""

    def __init__(self, cap: int = EXEC_OUTPUT_CAP) -> None:
        self._half = max(cap // 2, 1)
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.cut = 0

    def append(self, data: bytes) -> None:
        room = self._half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size - len(self._tail[0]) >= self._half:
            self.cut += len(self._tail[0])
            self._tail_size -= len(self._tail.popleft())
        excess = self._tail_size - self._half
        if excess > 0:
            self._tail[0] = self._tail[0][excess:]
            self._tail_size -= excess
            self.cut += excess

    def drop_prefix(self, size: int) -> None:
        """Forget the first `size` bytes of the head (they were not output)."""
        del self.head[:size]

    def value(self) -> bytes:
        tail = b"".join(self._tail)
        if not self.cut:
            return bytes(self.head) + tail
        return bytes(self.head) + f"\n[... {self.cut} bytes cut ...]\n".encode() + tail
