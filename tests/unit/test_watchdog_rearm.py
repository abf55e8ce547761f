"""A watchdog lost with its engine is started again once, however many threads find it
lost at once: a second new one would let the first's input go, and the first would then
sweep every sandbox the process had started since (seen: a sandbox started just after an
engine restart, ended in the middle of its episode)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pytest_harbor.sandboxes.docker.watchdog import Watchdog


class Recorded:
    def __init__(self) -> None:
        self.armed: list[str] = []
        self.let_go: list[str] = []


def scripted(monkeypatch: pytest.MonkeyPatch) -> tuple[Watchdog, Recorded]:
    """A watchdog on no engine: the one armed first is lost, each new one is not; arming
    takes a moment (as a container's start does), so that threads overlap in it."""
    watchdog = Watchdog(images=None, endpoint=None, socket_path="/engine.sock")  # type: ignore[arg-type]
    recorded = Recorded()

    def arm(self: Watchdog, labels: Any) -> None:
        time.sleep(0.2)
        number = len(recorded.armed)
        recorded.armed.append(f"watchdog-{number}")
        self._container, self._connection = f"watchdog-{number}", f"input-{number}"

    def disarm(self: Watchdog) -> None:
        if self._connection is not None:
            recorded.let_go.append(self._connection)
        self._container, self._connection = None, None

    def lost(self: Watchdog) -> bool:
        # As the engine would answer: the first is gone; while none is armed, lost until
        # a new one is (Watchdog.lost's own rule).
        return self._lost if self._container is None else self._container == "watchdog-0"

    monkeypatch.setattr(Watchdog, "_arm", arm)
    monkeypatch.setattr(Watchdog, "_disarm", disarm)
    monkeypatch.setattr(Watchdog, "lost", lost)
    watchdog.arm({"pytest-harbor.run": "r"})
    return watchdog, recorded


def test_threads_that_find_it_lost_at_once_start_one_new_watchdog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watchdog, recorded = scripted(monkeypatch)
    together = threading.Barrier(4)
    started: list[bool] = []

    def start_a_sandbox() -> None:
        together.wait()
        started.append(watchdog.rearm_if_lost())

    threads = [threading.Thread(target=start_a_sandbox) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(started) == [False, False, False, True]
    assert recorded.armed == ["watchdog-0", "watchdog-1"]
    # Only the lost one's input was let go; the new one still watches.
    assert recorded.let_go == ["input-0"]
    assert watchdog.armed


def test_a_watchdog_that_is_not_lost_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    watchdog, recorded = scripted(monkeypatch)
    assert watchdog.rearm_if_lost()
    assert not watchdog.rearm_if_lost()
    assert recorded.armed == ["watchdog-0", "watchdog-1"]


def test_a_watchdog_armed_for_the_border_alone_retires_when_the_labels_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A build made ahead of the first item holds the border with no labels; the labels
    # come at the first item: a new watchdog first, then the old one retires (sweeping
    # nothing), never the other way round, which would leave a moment without a border.
    watchdog = Watchdog(images=None, endpoint=None, socket_path="/engine.sock")  # type: ignore[arg-type]
    events: list[str] = []

    def arm(self: Watchdog, labels: Any) -> None:
        number = len([event for event in events if event.startswith("armed")])
        events.append(f"armed {number} {sorted(labels)}")
        self._container, self._connection = f"watchdog-{number}", f"input-{number}"

    def let_go(connection: Any, *, retire: bool) -> None:
        events.append(f"let go {connection} retire={retire}")

    monkeypatch.setattr(Watchdog, "_arm", arm)
    monkeypatch.setattr("pytest_harbor.sandboxes.docker.watchdog._let_go", let_go)
    watchdog.arm({})
    watchdog.arm({})
    watchdog.arm({"pytest-harbor.run": "r"})
    watchdog.arm({"pytest-harbor.run": "r"})
    # A build that asks for the border alone once the labelled one holds it: nothing.
    watchdog.arm({})
    assert events == [
        "armed 0 []",
        "armed 1 ['pytest-harbor.run']",
        "let go input-0 retire=True",
    ]
    watchdog.disarm()
    assert events[-1] == "let go input-1 retire=False"
