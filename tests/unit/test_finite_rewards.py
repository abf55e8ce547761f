"""Arithmetic on rewards stays finite end to end: rewards of 1e308 average to 1e308 in a
reward.json's keys, a multi-step episode, a taskset's score and the report, where their
sum overflows to infinity."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_harbor.engine import EpisodeResult, TurnResult, read_reward
from pytest_harbor.engine.rollup import roll_up
from pytest_harbor.report import render_report
from pytest_harbor.run.metrics import score_taskset
from pytest_harbor.strict_json import mean
from tests.unit.test_report import row, write_results

BIG = 1e308
LARGEST = sys.float_info.max


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_the_mean_of_finite_values_is_finite_and_between_them(values: list[float]) -> None:
    average = mean(values)
    assert math.isfinite(average)
    low, high = min(values), max(values)
    slack = max(abs(low), abs(high)) * 1e-9 + 1e-300  # rounding of a division
    assert low - slack <= average <= high + slack


def test_the_mean_is_exact_when_the_sum_fits() -> None:
    assert mean([1, 0, 1]) == 2 / 3
    assert mean([0.1] * 10) == 0.1
    assert mean([LARGEST, LARGEST, LARGEST]) == LARGEST
    assert mean([LARGEST, -LARGEST]) == 0.0
    assert mean([-LARGEST, -LARGEST, -LARGEST]) == -LARGEST  # once +LARGEST
    assert math.isnan(mean([math.inf, -math.inf]))


def test_reward_json_keys_of_1e308_average_to_1e308() -> None:
    reading = read_reward({"reward.json": b'{"a": 1e308, "b": 1e308}'})
    assert (reading.reward, reading.failure_kind) == (BIG, None)


def _turn(step: str, reward: float) -> TurnResult:
    return TurnResult(step=step, reward=reward, verifier_rewards={"reward": reward, "x": reward})


def test_a_two_step_episode_of_1e308_per_step_averages_to_1e308() -> None:
    rolled = roll_up([_turn("a", BIG), _turn("b", BIG)], "mean")
    assert rolled.reward == BIG
    assert rolled.verifier_rewards == {"reward": BIG, "x": BIG}


def test_a_taskset_of_rewards_of_1e308_scores_a_mean_of_1e308() -> None:
    results = [
        EpisodeResult(
            task_id=f"t{index}",
            taskset="ts",
            repeat=0,
            agent="oracle",
            reward=BIG,
            turns=[_turn("episode", BIG)],
        )
        for index in range(3)
    ]
    score = score_taskset(
        [(result.task_id, "failed", result, None) for result in results], repeats=1
    )
    assert score.mean_reward == BIG


def test_the_reports_task_mean_of_rewards_of_1e308_is_finite(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    rows = [row("huge", repeat, folder=folder, reward=BIG) for repeat in range(2)]
    summary = write_results(folder, rows)
    html = render_report([summary], folder / "report.html")
    assert ">1e+308<" in html  # the task's mean reward
    assert not re.search(r"\b(inf|nan)\b", html, re.IGNORECASE)
