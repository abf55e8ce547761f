"""Locks shared by the processes of this machine: each is a file held with flock, so the
kernel lets go of it when its process ends, however it ends.

One home for them all: the results folder's lock, the lock that has one process build
each image, the slots that cap episodes at once (per run, per engine of a fleet), model
requests in flight and sandboxes starting at once, and the pace of sandbox creations.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["FileLock", "Pace", "Slots", "held"]

_POLL_S = 0.05


class FileLock:
    """An exclusive lock on one file; the file may carry a line saying who holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

    def try_acquire(self) -> bool:
        """Take the lock now if it is free; False when another holds it."""
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._handle = handle
        return True

    def acquire(self) -> None:
        """Wait until the lock is free, then take it."""
        handle = self.path.open("a+")
        fcntl.flock(handle, fcntl.LOCK_EX)
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def write_holder(self, text: str) -> None:
        """Say in the file who holds the lock (it must be held)."""
        assert self._handle is not None, "write_holder() needs the lock held"
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(text + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def holder(self) -> str:
        """What the holder wrote in the file ("" when nothing)."""
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""


@contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold the lock on `path` for the block, waiting for it first."""
    lock = FileLock(path)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


class Slots:
    """`count` slots shared by every process that opens the same `folder`: one lock
    file per slot. A process that dies never keeps its slot."""

    def __init__(self, folder: Path, count: int) -> None:
        self.folder = folder
        self.count = count
        folder.mkdir(parents=True, exist_ok=True)

    def acquire(self, timeout: float) -> FileLock | None:
        """A held slot (release() frees it), or None when none came free in time."""
        deadline = time.monotonic() + timeout
        while True:
            slot = self.try_acquire()
            if slot is not None:
                return slot
            if time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_S)

    def try_acquire(self) -> FileLock | None:
        """A held slot now, or None."""
        start = os.getpid() % self.count  # spread processes over the slots
        for offset in range(self.count):
            slot = self._slot((start + offset) % self.count)
            if slot.try_acquire():
                return slot
        return None

    def free(self) -> int:
        """How many slots are free now (each looked at, not kept)."""
        free = 0
        for index in range(self.count):
            slot = self._slot(index)
            if slot.try_acquire():
                slot.release()
                free += 1
        return free

    def _slot(self, index: int) -> FileLock:
        return FileLock(self.folder / f"slot-{index}.lock")


class Pace:
    """At most `per_second` events a second, across every process that opens the same
    `folder`: each takes the next free moment (kept in a file, under a lock) and waits
    for it."""

    def __init__(self, folder: Path, per_second: float) -> None:
        self.interval = 1.0 / per_second
        folder.mkdir(parents=True, exist_ok=True)
        self._lock = folder / "pace.lock"
        self._next = folder / "pace.next"

    def wait(self) -> float:
        """Wait for this process's moment; how long it waited."""
        with held(self._lock):
            try:
                due = float(self._next.read_text() or 0)
            except (OSError, ValueError):
                due = 0.0
            now = time.time()
            at = max(now, due)
            self._next.write_text(repr(at + self.interval))
        wait = at - now
        if wait > 0:
            time.sleep(wait)
        return wait
