"""The one place reward files are read: reward.json wins over reward.txt."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.strict_json import as_float, mean
from pytest_harbor.untrusted import load_json

__all__ = ["REWARD_FILES", "RewardReading", "read_reward"]

#: The reward files, the first one present wins.
REWARD_FILES = ("reward.json", "reward.txt")


@dataclass(frozen=True)
class RewardReading:
    """What the verifier's reward files say: a reward, or 0 with a failure kind and reason."""

    reward: float
    rewards: dict[str, float] | None
    source: str | None
    failure_kind: str | None = None
    failure_reason: str | None = None
    #: The failure is ours (sandbox, image), not the attempt's: the sample is out of the score.
    masked: bool = False

    @classmethod
    def failed(
        cls, kind: str, reason: str, source: str | None = None, *, masked: bool = False
    ) -> RewardReading:
        return cls(
            reward=0.0,
            rewards=None,
            source=source,
            failure_kind=kind,
            failure_reason=reason,
            masked=masked,
        )


def read_reward(
    files: Mapping[str, bytes], unusable: Mapping[str, str] | None = None
) -> RewardReading:
    """Read `reward.json`, else `reward.txt`, from the files of /logs/verifier.

    - reward.json must be a JSON object whose values are all numbers (not booleans) that
      are finite as floats (an integer too large for one is not); the episode reward is
      its `reward` key when present, else the mean of its values (finite: two values of
      1e308 average 1e308). It may nest arrays and objects at most MAX_DEPTH deep (a value
      that is one is not a number anyway).
    - reward.txt must hold one number, finite as a float.
    - A missing, empty or invalid file gives reward 0 and a failure kind; so does one in
      `unusable` (a reward file there but not read: a link, a FIFO, too large), with the
      reason given there.
    """
    for name in REWARD_FILES:
        if unusable and name in unusable and name not in files:
            return _invalid(name, unusable[name])
        if name in files:
            break
    if "reward.json" in files:
        return _read_json(files["reward.json"])
    if "reward.txt" in files:
        return _read_text(files["reward.txt"])
    return RewardReading.failed(
        FailureKind.REWARD_MISSING,
        "the verifier wrote neither /logs/verifier/reward.json nor /logs/verifier/reward.txt",
    )


def _invalid(source: str, reason: str) -> RewardReading:
    return RewardReading.failed(FailureKind.REWARD_INVALID, f"{source} {reason}", source)


def _read_json(data: bytes) -> RewardReading:
    source = "reward.json"
    if not data.strip():
        return _invalid(source, "is empty")
    value, error = load_json(data)
    if error is not None:
        return _invalid(source, error)
    if not isinstance(value, dict):
        return _invalid(source, f"must be a JSON object of numbers, got {type(value).__name__}")
    if not value:
        return _invalid(source, "is an empty object: it needs at least one numeric key")
    rewards: dict[str, float] = {}
    for key, number in value.items():
        if isinstance(number, bool) or not isinstance(number, int | float):
            return _invalid(source, f"key {_shown(key)} is not a number: {_shown(number)}")
        finite = as_float(number)
        if finite is None:
            return _invalid(source, f"key {_shown(key)} is not a finite number: {_shown(number)}")
        rewards[key] = finite
    reward = rewards["reward"] if "reward" in rewards else mean(rewards.values())
    return RewardReading(reward=reward, rewards=rewards, source=source)


def _read_text(data: bytes) -> RewardReading:
    source = "reward.txt"
    text = data.decode("utf-8", errors="replace").strip()
    if not text:
        return _invalid(source, "is empty")
    try:
        number = float(text)
    except ValueError:
        return _invalid(source, f"does not hold a number: {_shown(text)}")
    reward = as_float(number)
    if reward is None:
        return _invalid(source, f"does not hold a finite number: {_shown(text)}")
    return RewardReading(reward=reward, rewards={"reward": reward}, source=source)


def _shown(value: object) -> str:
    """A value for a message: its repr, cut to 80 characters (a number may have
    thousands of digits)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"
