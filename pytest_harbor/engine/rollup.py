"""A multi-step episode's result from its turns: roll-up and the early-stop rule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.results import TurnResult
from pytest_harbor.strict_json import mean

__all__ = ["RollUp", "roll_up", "stop_reason"]


@dataclass(frozen=True)
class RollUp:
    reward: float
    verifier_rewards: dict[str, float] | None
    mask_sample: bool
    failure_kind: str | None
    failure_reason: str | None
    verifier_mode: str


def roll_up(
    turns: Sequence[TurnResult],
    strategy: str,
    stopped_after: str | None = None,
    stop_reason: str | None = None,
    *,
    declared: Sequence[str] | None = None,
) -> RollUp:
    """`mean`: over every turn that ran, a turn without a valid reward counting 0 on every
    key and a key a turn lacks counting 0; `final`: the last turn that ran. With the
    `declared` steps (the strict roll-up), a step that did not run counts as a turn with
    0 on every key: the mean is over every declared step, and `final` is the last declared
    step's, 0 when it did not run. One masked turn masks the episode. The failure is the
    stopping turn's (`harbor:min_reward_missed` when its only fault was its gate), else the
    first turn's that has one."""
    counted: Sequence[TurnResult | None] = turns
    if declared is not None:
        ran = {turn.step: turn for turn in turns}
        counted = [ran.get(step) for step in declared]
    if strategy == "final":
        last = counted[-1]
        reward = last.reward if last is not None else 0.0
        rewards = last.verifier_rewards if last is not None else _zeros(turns)
    else:
        reward, rewards = _mean_rewards(counted)
    kind, reason = _episode_failure(turns, stopped_after, stop_reason)
    modes = {turn.verifier_mode for turn in turns}
    return RollUp(
        reward=reward,
        verifier_rewards=rewards,
        mask_sample=any(turn.mask_sample for turn in turns),
        failure_kind=kind,
        failure_reason=reason,
        verifier_mode=modes.pop() if len(modes) == 1 else "mixed",
    )


def _mean_rewards(
    turns: Sequence[TurnResult | None],
) -> tuple[float, dict[str, float] | None]:
    """The mean reward and the mean of each key any turn has, a missing key counting 0 (a
    step that did not run, None, counts 0 on every key); no keys at all is None, as for a
    turn without a valid reward."""
    ran = [turn for turn in turns if turn is not None]
    keys = sorted({key for turn in ran for key in (turn.verifier_rewards or {})})
    rewards = {key: mean(_key(turn, key) for turn in turns) for key in keys}
    return mean(0.0 if turn is None else turn.reward for turn in turns), rewards or None


def _key(turn: TurnResult | None, key: str) -> float:
    return 0.0 if turn is None else (turn.verifier_rewards or {}).get(key, 0.0)


def _zeros(turns: Sequence[TurnResult]) -> dict[str, float] | None:
    """0 on every key a turn that ran had; None when none had any."""
    keys = {key for turn in turns for key in (turn.verifier_rewards or {})}
    return {key: 0.0 for key in sorted(keys)} or None


def _episode_failure(
    turns: Sequence[TurnResult], stopped_after: str | None, stop_reason: str | None
) -> tuple[str | None, str | None]:
    """The episode's failure kind and reason: the stopping turn's, else the first turn's
    that has one; a stop with no failure of its own was its `min_reward` gate."""
    stopping = next((turn for turn in turns if turn.step == stopped_after), None)
    failing = stopping or next((turn for turn in turns if turn.failure_kind is not None), None)
    if failing is not None and failing.failure_kind is not None:
        return failing.failure_kind, failing.failure_reason
    if stopped_after is not None:
        return FailureKind.MIN_REWARD_MISSED, stop_reason
    return None, None


def stop_reason(turn: TurnResult, min_reward: float | dict[str, float] | None) -> str | None:
    """Why the episode stops after `turn`, or None to go on.

    It stops after a masked turn, a turn without a valid reward, and a turn below its
    `min_reward`: a number gates the turn's reward, a table each key it names (a missing
    key, or no verifier result at all, fails the gate).
    """
    if turn.mask_sample:
        return f"turn {turn.step} was masked ({turn.failure_kind})"
    if turn.verifier_rewards is None:
        return f"turn {turn.step} has no valid reward ({turn.failure_kind})"
    if min_reward is None:
        return None
    if isinstance(min_reward, dict):
        gates = {key: turn.verifier_rewards.get(key) for key in min_reward}
        thresholds = min_reward
    else:
        gates, thresholds = {"reward": turn.reward}, {"reward": min_reward}
    for key, value in gates.items():
        if value is None or value < thresholds[key]:
            shown = "missing" if value is None else f"{value:g}"
            return f"turn {turn.step}: {key} {shown} is below its min_reward {thresholds[key]:g}"
    return None
