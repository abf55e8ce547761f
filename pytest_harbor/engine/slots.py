"""A cap on episodes at once across every process of a run: N lock files, one per slot."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

__all__ = ["EpisodeSlots", "Slot"]

_POLL_S = 0.05


class Slot:
    """A held slot; release() lets the next episode in."""

    def __init__(self, handle: IO[str]) -> None:
        self._handle: IO[str] | None = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


class EpisodeSlots:
    """`count` slots shared by every process that opens the same `folder`.

    A lock held by a process that dies is released by the kernel, so a killed worker
    never keeps its slot.
    """

    def __init__(self, folder: Path, count: int) -> None:
        self.folder = folder
        self.count = count
        folder.mkdir(parents=True, exist_ok=True)

    def acquire(self, timeout: float) -> Slot | None:
        """A free slot, or None when none came free within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        start = os.getpid() % self.count  # spread processes over the slots
        while True:
            for offset in range(self.count):
                slot = self._try((start + offset) % self.count)
                if slot is not None:
                    return slot
            if time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_S)

    def try_acquire(self) -> Slot | None:
        """A free slot now, or None."""
        start = os.getpid() % self.count
        for offset in range(self.count):
            slot = self._try((start + offset) % self.count)
            if slot is not None:
                return slot
        return None

    def free(self) -> int:
        """How many slots are free now (each looked at, not held)."""
        free = 0
        for index in range(self.count):
            slot = self._try(index)
            if slot is not None:
                slot.release()
                free += 1
        return free

    def _try(self, index: int) -> Slot | None:
        handle = (self.folder / f"slot-{index}.lock").open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        return Slot(handle)
