"""The mapping from a scored turn to passed / failed / error / skipped."""

from __future__ import annotations

import pytest

from pytest_harbor.engine import TurnResult, decide_outcome


def turn(**fields: object) -> TurnResult:
    base: dict[str, object] = {"step": "episode", "reward": 1.0, "agent_exit_code": 0}
    return TurnResult.model_validate({**base, **fields})


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({}, "passed"),
        ({"reward": 0.99}, "failed"),
        ({"reward": 1.5}, "failed"),
        ({"agent_exit_code": 2, "failure_kind": "harbor:solution_failed"}, "failed"),
        ({"agent_exit_code": None}, "failed"),
        ({"reward": 0.0, "mask_sample": True, "failure_kind": "harbor:verifier_error"}, "error"),
    ],
)
def test_validation_runs(fields: dict[str, object], status: str) -> None:
    assert decide_outcome(turn(**fields), validation=True, pass_reward=1.0).status == status


@pytest.mark.parametrize(
    ("fields", "pass_reward", "status"),
    [
        ({"reward": 1.0}, 1.0, "passed"),
        ({"reward": 0.5}, 1.0, "failed"),
        ({"reward": 0.5}, 0.5, "passed"),
        ({"reward": 0.0, "mask_sample": True}, 0.0, "skipped"),
    ],
)
def test_agent_runs(fields: dict[str, object], pass_reward: float, status: str) -> None:
    outcome = decide_outcome(
        turn(agent_exit_code=None, **fields), validation=False, pass_reward=pass_reward
    )
    assert outcome.status == status


def test_headline_carries_reward_kind_and_reason() -> None:
    outcome = decide_outcome(
        turn(reward=0.0, failure_kind="harbor:reward_missing", failure_reason="no file"),
        validation=True,
        pass_reward=1.0,
    )
    assert outcome.headline == "reward 0 (harbor:reward_missing): no file"
