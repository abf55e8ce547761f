"""An episode's clock: its deadline, what that leaves each phase, and the phase timings."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.tasks import Turn

__all__ = ["EpisodeClock", "now_iso"]


def now_iso() -> str:
    """The wall-clock time now, as rows record it."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class EpisodeClock:
    """The one place an episode asks how much time it has left.

    The deadline opens at the seed (`start()`; a retry opens a fresh one) and holds until
    the last turn's verification; before it opens, time is unbounded. The verifier's
    share of a turn (its timeout and `verifier_grace_s`) is kept back from everything
    before it. Timings of the episode's phases are kept here too.
    """

    def __init__(self, verifier_grace_s: float) -> None:
        self._grace_s = verifier_grace_s
        self._deadline_s = 0.0
        self._deadline: float | None = None
        self._started: float | None = None
        self._last_turn: float | None = None
        self._cleaned: float | None = None
        #: Seconds each phase took, by name (`build_s`, `seed_s`, ...).
        self.phases: dict[str, float] = {}
        self.started_at: str | None = None
        self.finished_at: str | None = None

    def start(self, deadline_s: float) -> float:
        """Open the deadline, `deadline_s` from now; return the monotonic start."""
        self._started = started = time.monotonic()
        self.started_at = now_iso()
        self._deadline_s = deadline_s
        self._deadline = started + deadline_s
        return started

    def took(self, phase: str, since: float) -> float:
        """Record that `phase` ran from `since` (a monotonic time) until now."""
        self.phases[phase] = spent = time.monotonic() - since
        return spent

    def remaining(self) -> float:
        """Seconds left before the deadline (infinite before the seed)."""
        if self._deadline is None:
            return math.inf
        return self._deadline - time.monotonic()

    def within(self, seconds: float) -> float:
        """`seconds`, or what is left when that is less."""
        return min(seconds, self.remaining())

    def before_verifier(self, turn: Turn) -> float:
        """What is left for everything of `turn` before its verifier, once the verifier
        has its share (its timeout and grace)."""
        return self.remaining() - turn.verifier_timeout_sec - self._grace_s

    def agent_window(self, turn: Turn, most_grace_s: float) -> tuple[float, float]:
        """The agent's seconds for `turn` (its timeout, or what is left before the
        verifier's share when that is less) and the grace an overrunning harness has to wind
        down in: what the verifier's share leaves, at least 1 s and at most `most_grace_s`.
        Raises EpisodeError when nothing is left."""
        room = self.before_verifier(turn)
        budget = turn.agent_timeout_sec
        if budget is None or budget > room:
            if room <= 0:
                raise self.timed_out("the agent")
            budget = room
        spare = room - budget + self._grace_s
        return budget, min(most_grace_s, max(1.0, spare - self._grace_s))

    def verifier_budget(self, turn: Turn) -> float:
        """The verifier's timeout, within what the deadline leaves after its grace."""
        return min(turn.verifier_timeout_sec, self.remaining() - self._grace_s)

    def require(self, phase: str) -> None:
        """Raise EpisodeError (`harbor:episode_timeout`) once the deadline has passed."""
        if self.remaining() <= 0:
            raise self.timed_out(phase)

    def timed_out(self, phase: str) -> EpisodeError:
        return EpisodeError(
            FailureKind.EPISODE_TIMEOUT,
            f"the episode ran past its deadline of {self._deadline_s:g} s during {phase}",
        )

    def turn_ended(self) -> None:
        self._last_turn = time.monotonic()
        self.finished_at = now_iso()

    def cleaned(self, since: float) -> None:
        """Record the end of cleanup, which ran from `since`."""
        self._cleaned = time.monotonic()
        self.phases["cleanup_s"] = self._cleaned - since

    @property
    def total_s(self) -> float | None:
        """From the start of the seed to the end of cleanup, or of the last turn when
        cleanup is still to come."""
        end = self._cleaned if self._cleaned is not None else self._last_turn
        if self._started is None or end is None:
            return None
        return end - self._started
