"""Where an episode is (making its images, seeding, the agent's turn, verifying), told to
whoever watches it: the pytest plugin shows it live, plain Python may ignore it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Literal

__all__ = ["EpisodeProgress", "Phase", "PhaseListener"]

Phase = Literal["building", "seeding", "agent", "verifying"]

#: Told the phase an episode enters and the turn it is in (None before the first).
PhaseListener = Callable[[Phase, "str | None"], None]


class EpisodeProgress:
    """An episode's phase. A listener that fails is the watcher's problem, never the
    episode's: its error is dropped (the episode's result does not depend on being
    watched)."""

    def __init__(self, listener: PhaseListener | None = None) -> None:
        self._listener = listener
        self.phase: Phase | None = None
        self.step: str | None = None

    def enter(self, phase: Phase, step: str | None = None) -> None:
        if (phase, step) == (self.phase, self.step):
            return
        self.phase, self.step = phase, step
        if self._listener is not None:
            with contextlib.suppress(Exception):  # see the class's docstring
                self._listener(phase, step)
