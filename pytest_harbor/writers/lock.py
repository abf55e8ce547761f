"""One run at a time in a results folder: the run that writes it holds a lock on it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

__all__ = ["LOCK_FILE", "ResultsFolderBusy", "ResultsLock"]

#: In the taskset's results folder; it names the run that holds it.
LOCK_FILE = ".run.lock"


class ResultsFolderBusy(Exception):
    """Another run is writing the folder."""


class ResultsLock:
    """An exclusive lock on a results folder for as long as the run lives (the kernel lets
    go of it when the process ends, however it ends)."""

    def __init__(self, folder: Path, holder: str) -> None:
        self.folder = folder
        self.holder = holder
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """Take the folder, or raise ResultsFolderBusy naming the run that has it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = (self.folder / LOCK_FILE).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            other = handle.read().strip() or "a run that did not say which"
            handle.close()
            raise ResultsFolderBusy(
                f"{self.folder} is being written by another run ({other}); wait for it to "
                "end, or give this one another --harbor-results-dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(self.holder + "\n")
        handle.flush()
        os.fsync(handle.fileno())
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
