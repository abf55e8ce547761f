"""The episode engine: seed, activate, verify, clean up (no pytest here)."""

from pytest_harbor.engine.episode import Episode, TurnOutput
from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.outcomes import Outcome, decide_outcome
from pytest_harbor.engine.results import EpisodeResult, PhaseTimings, TurnResult, episode_id
from pytest_harbor.engine.rewards import RewardReading, read_reward

__all__ = [
    "Episode",
    "EpisodeError",
    "EpisodeResult",
    "FailureKind",
    "Outcome",
    "PhaseTimings",
    "RewardReading",
    "TurnOutput",
    "TurnResult",
    "decide_outcome",
    "episode_id",
    "read_reward",
]
