"""The backstop behind the engine's own deadlines: each item's pytest-timeout timer.

Every turn item carries `pytest.mark.timeout(<seconds>)` sized from its episode's budget
(see `backstop_seconds`), and this plugin runs that timer itself: when it fires it removes
the trial's sandbox and fails the item as `harbor:episode_timeout`. It never ends the
process (pytest-timeout's `thread` method would call `os._exit`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from pytest_harbor.engine import EpisodeError, FailureKind
from pytest_harbor.plugin.nodes import HarborTurnItem

__all__ = ["pytest_timeout_cancel_timer", "pytest_timeout_set_timer"]

_CANCEL = pytest.StashKey[Callable[[], None]]()


#: The longest alarm set, about three years: the platform's timer refuses a time past its
#: range (3e9 s raised OverflowError and ended the whole session).
MAX_ALARM_S = 1e8


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if not isinstance(item, HarborTurnItem):
        return None
    seconds = float(settings.timeout)
    reason = (
        f"the item ran past its backstop of {seconds:g} s (pytest-timeout); its sandbox was removed"
    )
    if threading.current_thread() is threading.main_thread():
        item.stash[_CANCEL] = _alarm(seconds, item, reason)
    else:
        # No signals off the main thread: remove the sandbox, and the episode's next
        # step against it fails.
        timer = threading.Timer(seconds, item.trial.abort)
        timer.daemon = True
        timer.start()
        item.stash[_CANCEL] = timer.cancel
    return True


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    if not isinstance(item, HarborTurnItem):
        return None
    cancel = item.stash.get(_CANCEL, None)
    if cancel is not None:
        cancel()
        del item.stash[_CANCEL]
    return True


def _alarm(seconds: float, item: HarborTurnItem, reason: str) -> Callable[[], None]:
    def fire(signum: int, frame: FrameType | None) -> None:
        cancel()
        item.trial.abort()
        raise EpisodeError(FailureKind.EPISODE_TIMEOUT, reason)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    previous = signal.signal(signal.SIGALRM, fire)
    # A task may ask for any finite timeout: past what the timer holds, none is set.
    signal.setitimer(signal.ITIMER_REAL, min(seconds, MAX_ALARM_S))
    return cancel
