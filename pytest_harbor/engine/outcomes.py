"""The one place an episode result becomes a test outcome."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_harbor.engine.results import TurnResult

__all__ = ["Outcome", "decide_outcome", "nop_check_outcome"]

Status = Literal["passed", "failed", "error", "skipped"]


@dataclass(frozen=True)
class Outcome:
    status: Status
    headline: str


def decide_outcome(result: TurnResult, *, validation: bool, pass_reward: float) -> Outcome:
    """Map a scored turn (a single-step episode's one turn) to passed / failed / error /
    skipped.

    Validation (oracle) runs pass when the reward is exactly 1 and solve.sh exited 0; a
    masked sample is an error. Agent runs pass when the reward reaches `pass_reward`; a
    masked sample is skipped, since it is out of the score.
    """
    headline = _headline(result)
    if result.mask_sample:
        return Outcome("error" if validation else "skipped", f"masked: {headline}")
    if validation:
        passed = result.reward == 1.0 and result.agent_exit_code == 0
    else:
        passed = result.reward >= pass_reward
    return Outcome("passed" if passed else "failed", headline)


def _headline(result: TurnResult) -> str:
    text = f"reward {result.reward:g}"
    if result.failure_kind:
        text += f" ({result.failure_kind})"
    if result.failure_reason:
        text += f": {result.failure_reason}"
    return text


def nop_check_outcome(result: TurnResult) -> Outcome:
    """Check mode's empty agent: a turn passes when its reward stays below 1, since a
    verifier that accepts the untouched sandbox grades nothing. A masked sample is an
    error: the check learnt nothing from it."""
    headline = _headline(result)
    if result.mask_sample:
        return Outcome("error", f"masked: {headline}")
    if result.reward >= 1.0:
        return Outcome(
            "failed",
            f"an agent that does nothing scores {result.reward:g}: the verifier accepts the "
            f"sandbox as the task leaves it ({headline})",
        )
    return Outcome("passed", headline)
