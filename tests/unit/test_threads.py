"""Waiting for a thread in slices: the result is a plain join's, and a signal handler of
the main thread runs during a long wait even when the signal went to another thread."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from pytest_harbor.threads import join


def test_join_says_whether_the_thread_ended_in_time() -> None:
    done = threading.Event()
    thread = threading.Thread(target=done.wait, daemon=True)
    thread.start()
    assert join(thread, 0.3) is False
    done.set()
    assert join(thread) is True


def test_a_signal_taken_by_another_thread_still_interrupts_a_long_wait() -> None:
    """The attack on a plain join: SIGTERM lands on a worker thread (pthread_kill), so the
    main thread's wait is not interrupted; the handler must run anyway, within a slice."""

    class Interrupted(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGTERM, handler)
    blocker = threading.Event()
    waiting = threading.Thread(target=blocker.wait, daemon=True)
    waiting.start()
    other = threading.Thread(target=time.sleep, args=(5,), daemon=True)
    other.start()
    try:
        assert other.ident is not None
        threading.Timer(0.2, signal.pthread_kill, (other.ident, signal.SIGTERM)).start()
        started = time.monotonic()
        with pytest.raises(Interrupted):
            join(waiting, 30)
        assert time.monotonic() - started < 5
    finally:
        signal.signal(signal.SIGTERM, previous)
        blocker.set()
