"""Every reward-file case: reward.json wins, multi-key, empty, not JSON, non-numeric, NaN."""

from __future__ import annotations

import pytest

from pytest_harbor.engine import FailureKind, read_reward


def test_reward_txt() -> None:
    reading = read_reward({"reward.txt": b" 0.75\n"})
    assert (reading.reward, reading.rewards, reading.source) == (
        0.75,
        {"reward": 0.75},
        "reward.txt",
    )
    assert reading.failure_kind is None


def test_json_wins_over_txt() -> None:
    reading = read_reward({"reward.json": b'{"reward": 0.25}', "reward.txt": b"1"})
    assert (reading.reward, reading.source) == (0.25, "reward.json")


def test_broken_json_does_not_fall_back_to_txt() -> None:
    reading = read_reward({"reward.json": b"{not json", "reward.txt": b"1"})
    assert reading.reward == 0.0
    assert reading.failure_kind == FailureKind.REWARD_INVALID
    assert "reward.json is not valid JSON" in (reading.failure_reason or "")


def test_multi_key_json_without_reward_key_is_the_mean() -> None:
    reading = read_reward({"reward.json": b'{"correctness": 1, "performance": 0.5}'})
    assert reading.reward == 0.75
    assert reading.rewards == {"correctness": 1.0, "performance": 0.5}


def test_multi_key_json_with_reward_key_uses_it() -> None:
    reading = read_reward({"reward.json": b'{"reward": 0.2, "style": 1}'})
    assert reading.reward == 0.2
    assert reading.rewards == {"reward": 0.2, "style": 1.0}


def test_missing() -> None:
    reading = read_reward({"test-stdout.txt": b"done"})
    assert reading.reward == 0.0
    assert reading.rewards is None
    assert reading.failure_kind == FailureKind.REWARD_MISSING


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({"reward.json": b""}, "reward.json is empty"),
        ({"reward.json": b"  \n"}, "reward.json is empty"),
        ({"reward.txt": b""}, "reward.txt is empty"),
        ({"reward.json": b"1"}, "must be a JSON object"),
        ({"reward.json": b"[1, 2]"}, "must be a JSON object"),
        ({"reward.json": b"{}"}, "empty object"),
        ({"reward.json": b'{"reward": "high"}'}, "not a number"),
        ({"reward.json": b'{"reward": true}'}, "not a number"),
        ({"reward.json": b'{"reward": null}'}, "not a number"),
        ({"reward.json": b'{"reward": NaN}'}, "not a finite number"),
        ({"reward.json": b'{"reward": Infinity}'}, "not a finite number"),
        ({"reward.txt": b"high"}, "does not hold a number"),
        ({"reward.txt": b"nan"}, "not hold a finite number"),
        ({"reward.txt": b"inf"}, "not hold a finite number"),
        ({"reward.txt": b"1 2"}, "does not hold a number"),
    ],
)
def test_invalid_files_score_zero_with_reason(files: dict[str, bytes], reason: str) -> None:
    reading = read_reward(files)
    assert reading.reward == 0.0
    assert reading.rewards is None
    assert reading.failure_kind == FailureKind.REWARD_INVALID
    assert reason in (reading.failure_reason or "")
    assert not reading.masked


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"reward.json": b'{"reward": 1' + b"0" * 400 + b"}"}, "is not a finite number"),
        ({"reward.json": b'{"reward": ' + b"[" * 3000 + b"]" * 3000 + b"}"}, "deeper than"),
        ({"reward.json": b'{"reward": 1' + b"0" * 5000 + b"}"}, "is not a finite number"),
        ({"reward.json": b'{"a": 1e999}'}, "is not a finite number"),
        ({"reward.txt": b"1" + b"0" * 400}, "does not hold a finite number"),
        ({"reward.txt": b"-inf"}, "does not hold a finite number"),
    ],
)
def test_values_out_of_a_floats_range_are_invalid(files: dict[str, bytes], why: str) -> None:
    reading = read_reward(files)
    assert (reading.reward, reading.failure_kind) == (0.0, FailureKind.REWARD_INVALID)
    assert why in (reading.failure_reason or "")
    assert len(reading.failure_reason or "") < 300  # a 400-digit number is not repeated whole


@pytest.mark.parametrize(
    ("data", "mean"),
    [
        (b'{"a": 1e300, "b": 1e300}', 1e300),
        (b'{"a": 1e308, "b": 1e308}', 1e308),
        (b'{"a": -1.5e308, "b": -1.5e308, "c": 0}', -1e308),
        (b'{"a": 1.7976931348623157e308, "b": 1.7976931348623157e308}', 1.7976931348623157e308),
    ],
)
def test_large_values_average_to_a_finite_mean(data: bytes, mean: float) -> None:
    """The mean of finite values is finite, however large: their sum may overflow, the
    mean never does."""
    reading = read_reward({"reward.json": data})
    assert (reading.reward, reading.failure_kind) == (pytest.approx(mean), None)
