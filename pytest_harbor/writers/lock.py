"""One run at a time in a results folder: the run that writes it holds a lock on it."""

from __future__ import annotations

from pathlib import Path

from pytest_harbor.locks import FileLock

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
        self._lock = FileLock(folder / LOCK_FILE)

    def acquire(self) -> None:
        """Take the folder, or raise ResultsFolderBusy naming the run that has it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self._lock.try_acquire():
            other = self._lock.holder() or "a run that did not say which"
            raise ResultsFolderBusy(
                f"{self.folder} is being written by another run ({other}); wait for it to "
                "end, or give this one another --harbor-results-dir"
            )
        self._lock.write_holder(self.holder)

    def release(self) -> None:
        self._lock.release()
