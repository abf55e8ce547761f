"""Waiting for a thread in slices, so that a signal (SIGTERM, Ctrl-C) reaches the main
thread's handler within a fraction of a second even when the kernel handed it to another
thread: a single long join in the main thread is woken only by a signal delivered to the
main thread itself."""

from __future__ import annotations

import threading
import time

__all__ = ["join"]

#: The longest single wait.
SLICE_S = 0.25


def join(thread: threading.Thread, timeout: float | None = None) -> bool:
    """Wait for `thread` up to `timeout` seconds (None: until it ends); True when it ended."""
    end = None if timeout is None else time.monotonic() + max(timeout, 0.0)
    while thread.is_alive():
        left = SLICE_S if end is None else min(SLICE_S, end - time.monotonic())
        if left <= 0:
            break
        thread.join(left)
    return not thread.is_alive()
