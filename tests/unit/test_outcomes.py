"""The mapping from an episode result to passed / failed / error / skipped."""

from __future__ import annotations

import pytest

from pytest_harbor.engine import EpisodeResult, decide_outcome


def result(**fields: object) -> EpisodeResult:
    base: dict[str, object] = {
        "task_id": "t",
        "taskset": "s",
        "repeat": 0,
        "agent": "oracle",
        "reward": 1.0,
        "solution_exit_code": 0,
    }
    return EpisodeResult.model_validate({**base, **fields})


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({}, "passed"),
        ({"reward": 0.99}, "failed"),
        ({"reward": 1.5}, "failed"),
        ({"solution_exit_code": 2, "failure_kind": "harbor:solution_failed"}, "failed"),
        ({"solution_exit_code": None}, "failed"),
        ({"reward": 0.0, "mask_sample": True, "failure_kind": "harbor:verifier_error"}, "error"),
    ],
)
def test_validation_runs(fields: dict[str, object], status: str) -> None:
    assert decide_outcome(result(**fields), validation=True, pass_reward=1.0).status == status


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
        result(agent="nop", solution_exit_code=None, **fields),
        validation=False,
        pass_reward=pass_reward,
    )
    assert outcome.status == status


def test_headline_carries_reward_kind_and_reason() -> None:
    outcome = decide_outcome(
        result(reward=0.0, failure_kind="harbor:reward_missing", failure_reason="no file"),
        validation=True,
        pass_reward=1.0,
    )
    assert outcome.headline == "reward 0 (harbor:reward_missing): no file"
