"""The one place an episode result becomes a test outcome."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pytest_harbor.engine.results import TurnResult

__all__ = [
    "Outcome",
    "decide_outcome",
    "nop_check_outcome",
    "probe_check_outcome",
    "probe_findings",
]

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


def probe_check_outcome(result: TurnResult) -> Outcome:
    """Check mode's probe (harnesses/probe.py): a turn fails when an agent that only
    created the files the tests name scores above 0, or when the probe found the answer
    within reach (a git history, the solution's or tests' text in the image)."""
    headline = _headline(result)
    if result.mask_sample:
        return Outcome("error", f"masked: {headline}")
    findings = probe_findings(result.response)
    found = [
        what
        for what, key in (("a git history", "git"), ("the solution's text in the image", "image"))
        if findings.get(key)
    ]
    if result.reward > 0.0 and findings.get("created"):
        found.insert(0, f"a score of {result.reward:g} for only creating the files the tests name")
    if found:
        return Outcome("failed", f"the task can be won without the work: {'; '.join(found)}")
    return Outcome("passed", headline)


def probe_findings(response: str | None) -> dict[str, list[Any]]:
    """The probe's findings from its answer (empty when it has none, or a bad one)."""
    try:
        data = json.loads(response or "{}")
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: value for key, value in data.items() if isinstance(value, list)}


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
