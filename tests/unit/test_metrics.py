"""pass@k, episode statuses and the numbers of a taskset's summary."""

from __future__ import annotations

from math import comb

import pytest

from pytest_harbor.engine import EpisodeResult, TurnResult
from pytest_harbor.run.metrics import (
    episode_status,
    pass_at_k,
    pass_at_k_values,
    score_taskset,
)


def _result(task: str, reward: float, *, masked: bool = False, exit_code: int = 0) -> EpisodeResult:
    turn = TurnResult(step="episode", reward=reward, mask_sample=masked, agent_exit_code=exit_code)
    return EpisodeResult(
        task_id=task,
        taskset="ts",
        repeat=0,
        agent="oracle",
        reward=reward,
        mask_sample=masked,
        turns=[turn],
    )


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 2, 2, 1 - 1 / 6),
        (4, 0, 4, 0.0),
        (4, 4, 1, 1.0),
        (5, 2, 4, 1.0),  # fewer failures than k: every draw of k holds a pass
        (10, 3, 4, 1 - comb(7, 4) / comb(10, 4)),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(2, 1, 3), (2, 3, 1), (3, 1, 0)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_k_runs_through_powers_of_two_up_to_the_repeats() -> None:
    assert pass_at_k_values(1) == [1]
    assert pass_at_k_values(4) == [1, 2, 4]
    assert pass_at_k_values(6) == [1, 2, 4]
    assert pass_at_k_values(8) == [1, 2, 4, 8]


def test_episode_status_for_the_oracle_and_for_agents() -> None:
    assert episode_status(_result("t", 1.0), validation=True, pass_reward=1.0) == "passed"
    # The oracle also needs solve.sh to exit 0.
    assert (
        episode_status(_result("t", 1.0, exit_code=1), validation=True, pass_reward=1.0) == "failed"
    )
    assert episode_status(_result("t", 0.6), validation=False, pass_reward=0.5) == "passed"
    assert episode_status(_result("t", 0.4), validation=False, pass_reward=0.5) == "failed"
    assert (
        episode_status(_result("t", 0.0, masked=True), validation=False, pass_reward=0.5)
        == "masked"
    )


def test_taskset_score_counts_means_kinds_and_pass_at_k() -> None:
    passed, failed = _result("a", 1.0), _result("a", 0.0)
    episodes = [
        ("a", "passed", passed, None),
        ("a", "failed", failed, "harbor:reward_missing"),
        ("a", "passed", passed, None),
        ("a", "passed", passed, None),
        ("b", "failed", _result("b", 0.5), None),
        ("b", "masked", _result("b", 0.0, masked=True), "harbor:entrypoint_failed"),
        ("b", "no_result", None, "harbor:worker_died"),
        ("b", "failed", _result("b", 0.0), None),
        ("c", "skipped", None, None),
        ("c", "not_run", None, None),
    ]
    score = score_taskset(episodes, repeats=4)
    assert score.episodes == 9  # not_run is not an episode
    assert score.statuses == {
        "passed": 3,
        "failed": 3,
        "masked": 1,
        "no_result": 1,
        "skipped": 1,
        "not_run": 1,
    }
    # Masked and result-less episodes are out of the mean: (1 + 0 + 1 + 1 + 0.5 + 0) / 6.
    assert score.mean_reward == pytest.approx(3.5 / 6)
    assert score.failure_kinds == {
        "harbor:reward_missing": 1,
        "harbor:entrypoint_failed": 1,
        "harbor:worker_died": 1,
    }
    # a: 4 samples, 3 passed; b: 2 scored samples, none passed (so no pass@4 for b).
    assert score.pass_at_k_per_task[1] == {"a": 0.75, "b": 0.0}
    assert score.pass_at_k_per_task[2] == {"a": 1.0, "b": 0.0}
    assert score.pass_at_k_per_task[4] == {"a": 1.0}
    assert score.pass_at_k == {1: 0.375, 2: 0.5, 4: 1.0}


def test_no_pass_at_k_without_repeats_and_no_mean_without_scores() -> None:
    score = score_taskset([("a", "no_result", None, "harbor:sandbox_start_failed")], repeats=1)
    assert score.pass_at_k == {}
    assert score.mean_reward is None
    assert score.episodes == 1
